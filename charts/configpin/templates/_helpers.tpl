{{/* Names, labels and small derived values shared by the templates. */}}

{{- define "configpin.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The object name prefix: "<release>-<chart>", or the release name alone when it already
contains the chart name. Cut to 63 characters (a DNS label, as Service names must be).
*/}}
{{- define "configpin.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "configpin.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "configpin.selectorLabels" -}}
app.kubernetes.io/name: {{ include "configpin.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "configpin.labels" -}}
helm.sh/chart: {{ include "configpin.chart" . }}
{{ include "configpin.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: admission-webhook
app.kubernetes.io/part-of: configpin
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "configpin.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "configpin.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Cluster-scoped, so it is also the resourceName configpin may patch. */}}
{{- define "configpin.webhookConfigName" -}}
{{- include "configpin.fullname" . }}
{{- end }}

{{- define "configpin.digestKeySecretName" -}}
{{- default (printf "%s-digest-key" (include "configpin.fullname" .)) .Values.digestKey.secretName }}
{{- end }}

{{/* The serving certificate's Secret, written by configpin itself or by cert-manager. */}}
{{- define "configpin.certSecretName" -}}
{{- default (printf "%s-tls" (include "configpin.fullname" .)) .Values.selfSignedCerts.secretName }}
{{- end }}

{{- define "configpin.leaseName" -}}
{{- default (printf "%s-leader" (include "configpin.fullname" .)) .Values.controller.leaseName }}
{{- end }}

{{- define "configpin.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
policy/v1 PodDisruptionBudget is served from Kubernetes 1.21 and policy/v1beta1 is gone
from 1.25, so the version must follow the cluster. Installed against a cluster,
.Capabilities.APIVersions is the cluster's discovery set and decides alone. Rendered
offline (helm template, helm lint), Helm fills it with every group/version its own client
library knows, policy/v1 included even with --kube-version 1.20; the kube version check keeps
offline rendering for an older cluster right.
*/}}
{{- define "configpin.pdbApiVersion" -}}
{{- if and (.Capabilities.APIVersions.Has "policy/v1") (semverCompare ">=1.21-0" .Capabilities.KubeVersion.Version) -}}
policy/v1
{{- else -}}
policy/v1beta1
{{- end }}
{{- end }}

{{/* Namespaces never acted in: kube-system, configpin's own, and any the user adds. */}}
{{- define "configpin.excludedNamespaceList" -}}
{{- $names := list "kube-system" .Release.Namespace }}
{{- range .Values.webhook.excludeNamespaces }}
{{- $names = append $names . }}
{{- end }}
{{- toJson (uniq $names) }}
{{- end }}

{{- define "configpin.excludedNamespaces" -}}
{{- include "configpin.excludedNamespaceList" . }}
{{- end }}

{{/* The webhook's namespaceSelector as a label selector string, for the controller. */}}
{{- define "configpin.namespaceSelector" -}}
{{- $excluded := include "configpin.excludedNamespaceList" . | fromJsonArray }}
{{- printf "configpin.io/enabled=true,kubernetes.io/metadata.name notin (%s)" (join "," $excluded) }}
{{- end }}

{{/* Whether snapshot mode may be used: asked for, or the default mode. */}}
{{- define "configpin.snapshots" -}}
{{- if or .Values.snapshots.enabled (eq .Values.mode "snapshot") -}}
true
{{- end }}
{{- end }}

{{/*
ValidatingAdmissionPolicy is GA (admissionregistration.k8s.io/v1) from 1.30. As for the PDB,
the kube version check keeps offline rendering (which assumes every API Helm knows) right.
*/}}
{{- define "configpin.vap" -}}
{{- if and .Values.validatingAdmissionPolicy.enabled (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") (semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version) -}}
true
{{- end }}
{{- end }}

{{/*
The custom workload kinds: a list of {group, version, resource, template} (from
.Values.workloadKinds, group/version/resource/Kind=path, and argoRollouts), as JSON.
*/}}
{{- define "configpin.customKinds" -}}
{{- $kinds := list -}}
{{- if .Values.argoRollouts -}}
{{- $kinds = append $kinds (dict "group" "argoproj.io" "version" "v1alpha1" "resource" "rollouts" "template" "spec.template") -}}
{{- end -}}
{{- range .Values.workloadKinds -}}
{{- $halves := splitList "=" . -}}
{{- $parts := splitList "/" (first $halves) -}}
{{- if or (ne (len $parts) 4) (ne (len $halves) 2) -}}
{{- fail (printf "workloadKinds: %q is not group/version/resource/Kind=path" .) -}}
{{- end -}}
{{- $kinds = append $kinds (dict "group" (index $parts 0) "version" (index $parts 1) "resource" (index $parts 2) "template" (last $halves)) -}}
{{- end -}}
{{- toJson $kinds -}}
{{- end -}}
