#!/bin/sh
# Helm 3 post-renderer: the rendered chart on stdin, the same documents (pod templates stamped
# by configpin) on stdout. Helm passes --post-renderer-args after these defaults.
#
#   helm install web ./chart -n shop \
#     --post-renderer ./examples/helm/configpin-post-render.sh \
#     --post-renderer-args --namespace=shop \
#     --post-renderer-args --digest-key-secret=configpin/configpin-digest-key
set -eu
exec configpin render -f - --namespace "${HELM_NAMESPACE:-default}" "$@"
