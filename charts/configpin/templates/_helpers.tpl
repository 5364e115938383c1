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

{{/* The chart's labels, then commonLabels (which never replace one of the chart's). */}}
{{- define "configpin.labels" -}}
{{- include "configpin.labelsAnd" (dict "root" .) }}
{{- end }}

{{/*
The same with an object's own labels ("own"), which replace commonLabels but none of the
chart's. Called with (dict "root" $ "own" $labels).
*/}}
{{- define "configpin.labelsAnd" -}}
{{- $root := .root }}
{{- $labels := dict "helm.sh/chart" (include "configpin.chart" $root) "app.kubernetes.io/version" $root.Chart.AppVersion "app.kubernetes.io/component" "admission-webhook" "app.kubernetes.io/part-of" "configpin" "app.kubernetes.io/managed-by" $root.Release.Service }}
{{- $labels = merge $labels (include "configpin.selectorLabels" $root | fromYaml) }}
{{- $labels = merge $labels (deepCopy (.own | default dict)) }}
{{- toYaml (merge $labels (deepCopy ($root.Values.commonLabels | default dict))) }}
{{- end }}

{{/*
metadata.annotations of an object: commonAnnotations and its own ("own", which win), or
nothing at all. Called with (dict "root" $ "own" $annotations).
*/}}
{{- define "configpin.annotations" -}}
{{- $all := merge (deepCopy (.own | default dict)) (deepCopy (.root.Values.commonAnnotations | default dict)) }}
{{- with $all }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The pods' securityContext: the chart's, then podSecurityContext over it. */}}
{{- define "configpin.podSecurityContext" -}}
{{- $own := dict "runAsNonRoot" true "seccompProfile" (dict "type" "RuntimeDefault") }}
{{- if include "configpin.fixedIds" . }}
{{- $own = merge $own (dict "runAsUser" 65532 "runAsGroup" 65532 "fsGroup" 65532) }}
{{- end }}
{{- toYaml (mergeOverwrite $own (deepCopy .Values.podSecurityContext)) }}
{{- end }}

{{/* The container's securityContext: the chart's, then securityContext over it. */}}
{{- define "configpin.securityContext" -}}
{{- $own := dict "runAsNonRoot" true "allowPrivilegeEscalation" false "privileged" false "readOnlyRootFilesystem" true "capabilities" (dict "drop" (list "ALL")) "seccompProfile" (dict "type" "RuntimeDefault") }}
{{- if include "configpin.fixedIds" . }}
{{- $own = merge $own (dict "runAsUser" 65532 "runAsGroup" 65532) }}
{{- end }}
{{- toYaml (mergeOverwrite $own (deepCopy .Values.securityContext)) }}
{{- end }}

{{/*
Whether the pods name their UID, GID and fsGroup (the image's 65532): runAsIds fixed, or auto
on a cluster that is not OpenShift (which serves security.openshift.io/v1, whose SCCs assign
them from the namespace's range and refuse others).
*/}}
{{- define "configpin.fixedIds" -}}
{{- if or (eq .Values.runAsIds "fixed") (and (eq .Values.runAsIds "auto") (not (.Capabilities.APIVersions.Has "security.openshift.io/v1"))) -}}
true
{{- end }}
{{- end }}

{{/* The port configpin listens on in its pod, or on the node with hostNetwork. */}}
{{- define "configpin.port" -}}
{{- if .Values.hostNetwork.enabled }}
{{- .Values.hostNetwork.port }}
{{- else }}
{{- 8443 }}
{{- end }}
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

{{/*
The namespaces configpin acts in, as one LabelSelector (JSON): the opt-in label
(webhook.optInLabel), webhook.namespaceSelector, and none of the excluded namespaces. The
webhook entries' namespaceSelector is this object, and the server's --namespace-selector is
this object written as a selector string (configpin.namespaceSelector): one source, so that
the API server and configpin never disagree on where configpin acts.
*/}}
{{- define "configpin.namespaceSelectorObject" -}}
{{- $labels := deepCopy (.Values.webhook.namespaceSelector.matchLabels | default dict) }}
{{- with .Values.webhook.optInLabel.key }}
{{- $_ := set $labels . (toString $.Values.webhook.optInLabel.value) }}
{{- end }}
{{- $expressions := list }}
{{- range .Values.webhook.namespaceSelector.matchExpressions }}
{{- $expressions = append $expressions . }}
{{- end }}
{{- $excluded := include "configpin.excludedNamespaceList" . | fromJsonArray }}
{{- $expressions = append $expressions (dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" $excluded) }}
{{- $selector := dict "matchExpressions" $expressions }}
{{- if $labels }}
{{- $_ := set $selector "matchLabels" $labels }}
{{- end }}
{{- toJson $selector }}
{{- end }}

{{/* That selector as a label selector string, for the server (--namespace-selector). */}}
{{- define "configpin.namespaceSelector" -}}
{{- $selector := include "configpin.namespaceSelectorObject" . | fromJson }}
{{- $terms := list }}
{{- range $key, $value := ($selector.matchLabels | default dict) }}
{{- $terms = append $terms (printf "%s=%s" $key $value) }}
{{- end }}
{{- range $selector.matchExpressions }}
{{- if eq .operator "In" }}
{{- $terms = append $terms (printf "%s in (%s)" .key (join "," .values)) }}
{{- else if eq .operator "NotIn" }}
{{- $terms = append $terms (printf "%s notin (%s)" .key (join "," .values)) }}
{{- else if eq .operator "Exists" }}
{{- $terms = append $terms .key }}
{{- else if eq .operator "DoesNotExist" }}
{{- $terms = append $terms (printf "!%s" .key) }}
{{- else }}
{{- fail (printf "webhook.namespaceSelector: operator %q is not In, NotIn, Exists or DoesNotExist" .operator) }}
{{- end }}
{{- end }}
{{- join "," $terms }}
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
