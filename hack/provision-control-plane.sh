#!/usr/bin/env bash
# Provision the binaries the integration tests run: etcd, kube-apiserver and
# kube-controller-manager, in one folder laid out the envtest way (KUBEBUILDER_ASSETS).
#
# No prebuilt Kubernetes binary can be downloaded on our build machines, so:
#   - etcd 3.4 comes from Debian's etcd-server package;
#   - kube-apiserver and kube-controller-manager 1.20.2 are built from Debian bookworm's
#     source package `kubernetes` (the full tree with vendor/), with Go 1.15 taken from
#     Debian bullseye (bookworm's Go 1.19 builds an apiserver that crashes on the first
#     mutating-webhook patch).
# A current control plane, 1.36.2, cannot be built from any registry's packages: its binaries
# are kept prebuilt in the steering repo's shared/k8s/v1.36.2/bin.tar.xz (with a sha256), found
# beside the checkout (../shared/k8s) or in $CONFIGPIN_SHARED_K8S; they are checked and unpacked
# next to the same etcd.
# The result is cached (default ~/.cache/configpin/kubebuilder-assets/<version>) and reused.
#
# Usage: hack/provision-control-plane.sh [1.20.2|1.36.2]   # prints the assets folder on stdout
#        CONFIGPIN_ASSETS_DIR=/some/dir hack/provision-control-plane.sh
set -euo pipefail

K8S_VERSION="${1:-1.20.2}"
here="$(cd "$(dirname "$0")" && pwd)"
cache_root="${CONFIGPIN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/configpin}"
assets="${CONFIGPIN_ASSETS_DIR:-$cache_root/kubebuilder-assets/$K8S_VERSION}"
log() { echo "provision: $*" >&2; }
case "$K8S_VERSION" in
  1.20.2|1.36.2) ;;
  *) log "unknown version $K8S_VERSION (known: 1.20.2, 1.36.2)"; exit 2 ;;
esac

have_all() {
  [ -x "$assets/etcd" ] && [ -x "$assets/kube-apiserver" ] && [ -x "$assets/kube-controller-manager" ]
}
if have_all; then
  echo "$assets"
  exit 0
fi

mkdir -p "$cache_root" "$assets"
exec 9>"$cache_root/.provision.lock"
flock 9   # two test runs at once build only once
if have_all; then
  echo "$assets"
  exit 0
fi

sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

need_pkgs=()
command -v etcd >/dev/null 2>&1 || need_pkgs+=(etcd-server)
command -v rsync >/dev/null 2>&1 || need_pkgs+=(rsync)
command -v jq >/dev/null 2>&1 || need_pkgs+=(jq)
command -v dpkg-source >/dev/null 2>&1 || need_pkgs+=(dpkg-dev)
command -v make >/dev/null 2>&1 || need_pkgs+=(make)
command -v xz >/dev/null 2>&1 || need_pkgs+=(xz-utils)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing ${need_pkgs[*]}"
  sudo_ apt-get update -qq >&2
  # etcd-server's maintainer scripts may try to start a service: stop that, we start our own.
  sudo_ env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >&2
fi
etcd_bin=$(command -v etcd || echo /usr/bin/etcd)
cp -f "$etcd_bin" "$assets/etcd"

if [ "$K8S_VERSION" != 1.20.2 ]; then
  shared="${CONFIGPIN_SHARED_K8S:-$here/../../shared/k8s}"
  tarball="$shared/v$K8S_VERSION/bin.tar.xz"
  if [ ! -f "$tarball" ]; then
    log "no $K8S_VERSION binaries: $tarball is missing (set CONFIGPIN_SHARED_K8S to the folder that holds v$K8S_VERSION/bin.tar.xz)"
    exit 3
  fi
  (cd "$(dirname "$tarball")" && sha256sum --quiet -c bin.tar.xz.sha256) >&2 || {
    log "$tarball does not match its bin.tar.xz.sha256"; exit 3; }
  log "unpacking kube-apiserver and kube-controller-manager $K8S_VERSION"
  tmp=$(mktemp -d "$assets/.unpack.XXXXXX")
  tar -xJf "$tarball" -C "$tmp"
  for b in kube-apiserver kube-controller-manager; do mv -f "$tmp/$b" "$assets/$b"; done
  rm -rf "$tmp"
  have_all
  echo "$assets"
  exit 0
fi

work="$cache_root/build"
mkdir -p "$work/apt/lists/partial" "$work/apt/archives/partial"
# A private apt configuration: our own sources, our own lists, the system's untouched.
cat > "$work/apt/configpin.sources" <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian
Suites: bullseye
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
apt_opts=(-o "Dir::Etc::SourceList=$work/apt/configpin.sources" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$work/apt/lists" -o "Dir::Cache::Archives=$work/apt/archives"
          -o APT::Get::List-Cleanup=0 -o Debug::NoLocking=1)
log "updating private apt lists"
apt-get "${apt_opts[@]}" update -qq >&2

# Go 1.15 from bullseye, unpacked (not installed).
goroot="$work/go115/usr/lib/go-1.15"
if [ ! -x "$goroot/bin/go" ]; then
  log "fetching Go 1.15 from bullseye"
  (cd "$work/apt" && apt-get "${apt_opts[@]}" download golang-1.15-go golang-1.15-src >&2)
  rm -rf "$work/go115"
  for deb in "$work"/apt/golang-1.15-*.deb; do dpkg -x "$deb" "$work/go115"; done
fi
"$goroot/bin/go" version >&2

# The Kubernetes tree.
src="$work/src"
tree=$(ls -d "$src"/kubernetes-*/ 2>/dev/null | head -n 1 || true)
if [ -z "$tree" ] || [ ! -f "$tree/Makefile" ]; then
  log "fetching the kubernetes source package from bookworm"
  rm -rf "$src"; mkdir -p "$src"
  (cd "$src" && apt-get "${apt_opts[@]}" source --download-only kubernetes >&2)
  dsc=$(ls "$src"/kubernetes_*.dsc | head -n 1)
  (cd "$src" && dpkg-source --no-check -x "$dsc" >&2)
  tree=$(ls -d "$src"/kubernetes-*/ | head -n 1)
fi
tree="${tree%/}"
log "building kube-apiserver and kube-controller-manager in $(basename "$tree") (several minutes)"
gopath="$tree/.go"
mkdir -p "$gopath/src/k8s.io"
ln -sfn "$tree" "$gopath/src/k8s.io/kubernetes"
(
  cd "$gopath/src/k8s.io/kubernetes"
  export GOROOT="$goroot" GOPATH="$gopath" CGO_ENABLED=0 GOFLAGS=-mod=vendor GO111MODULE=off
  export PATH="$goroot/bin:$PATH" KUBE_GIT_VERSION="v$K8S_VERSION" KUBE_GIT_TREE_STATE=clean
  make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" >&2
)
for b in kube-apiserver kube-controller-manager; do
  cp -f "$tree/_output/local/go/bin/$b" "$assets/$b.tmp"
  mv -f "$assets/$b.tmp" "$assets/$b"
done
have_all
log "done"
echo "$assets"
