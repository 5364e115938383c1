#!/bin/sh
# Run by Helm 4 with the rendered manifests on stdin; HELM_NAMESPACE is the release namespace,
# which digests are keyed with (objects a chart renders usually name no namespace).
set -eu
exec configpin render -f - --namespace "${HELM_NAMESPACE:-default}" "$@"
