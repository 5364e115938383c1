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
# With --node, the same folder also gets what a real node runs (tests/node): kubelet,
# kube-scheduler and kube-proxy (1.20.2 built in the same tree with the same Go; 1.36.2 from
# shared/k8s/v1.36.2/node.tar.xz, checked against its sha256), and the machine gets Debian's
# containerd, runc, CNI plugins, iptables and conntrack when they are missing.
# The result is cached (default ~/.cache/configpin/kubebuilder-assets/<version>) and reused.
#
# Usage: hack/provision-control-plane.sh [--node] [1.20.2|1.36.2]   # prints the assets folder
#        CONFIGPIN_ASSETS_DIR=/some/dir hack/provision-control-plane.sh
set -euo pipefail

NODE=0
if [ "${1:-}" = --node ]; then NODE=1; shift; fi
K8S_VERSION="${1:-1.20.2}"
here="$(cd "$(dirname "$0")" && pwd)"
cache_root="${CONFIGPIN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/configpin}"
assets="${CONFIGPIN_ASSETS_DIR:-$cache_root/kubebuilder-assets/$K8S_VERSION}"
log() { echo "provision: $*" >&2; }
case "$K8S_VERSION" in
  1.20.2|1.36.2) ;;
  *) log "unknown version $K8S_VERSION (known: 1.20.2, 1.36.2)"; exit 2 ;;
esac

PLANE_BINS=(kube-apiserver kube-controller-manager)
NODE_BINS=(kubelet kube-scheduler kube-proxy)
# What a node needs from the machine: command (or file) -> Debian package.
NODE_PKGS=(containerd:containerd ctr:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins
           iptables:iptables conntrack:conntrack ip:iproute2 nsenter:util-linux)

missing_bins() {  # the Kubernetes binaries this run needs and lacks
  local b
  for b in "${PLANE_BINS[@]}"; do [ -x "$assets/$b" ] || echo "$b"; done
  if [ "$NODE" = 1 ]; then for b in "${NODE_BINS[@]}"; do [ -x "$assets/$b" ] || echo "$b"; done; fi
}
missing_pkgs() {  # the Debian packages this run needs and lacks
  local entry cmd
  command -v etcd >/dev/null 2>&1 || echo etcd-server
  if [ "$NODE" = 1 ]; then
    for entry in "${NODE_PKGS[@]}"; do
      cmd="${entry%%:*}"
      if [ "${cmd#/}" != "$cmd" ]; then [ -e "$cmd" ] && continue
      else command -v "$cmd" >/dev/null 2>&1 && continue; fi
      echo "${entry#*:}"
    done
  fi
}
have_all() {
  [ -x "$assets/etcd" ] && [ -z "$(missing_bins)" ] && [ -z "$(missing_pkgs)" ]
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
# Every apt-get goes through harness/apt.py: it waits for apt's locks (up to
# $CONFIGPIN_APT_LOCK_TIMEOUT s, default 600) instead of failing while unattended-upgrades holds
# them on a fresh machine, and says so on stderr. (The machine's python3: no virtualenv needed.)
apt_get=(python3 "$here/../harness/apt.py")

mapfile -t need_pkgs < <(missing_pkgs | sort -u)
command -v rsync >/dev/null 2>&1 || need_pkgs+=(rsync)
command -v jq >/dev/null 2>&1 || need_pkgs+=(jq)
command -v dpkg-source >/dev/null 2>&1 || need_pkgs+=(dpkg-dev)
command -v make >/dev/null 2>&1 || need_pkgs+=(make)
command -v xz >/dev/null 2>&1 || need_pkgs+=(xz-utils)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing ${need_pkgs[*]}"
  sudo_ "${apt_get[@]}" update -qq >&2
  # etcd-server's and containerd's maintainer scripts may try to start a service: stop that,
  # we start our own.
  sudo_ env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 "${apt_get[@]}" install -y -qq --no-install-recommends "${need_pkgs[@]}" >&2
fi
etcd_bin=$(command -v etcd || echo /usr/bin/etcd)
cp -f "$etcd_bin" "$assets/etcd"

mapfile -t want < <(missing_bins)
if [ ${#want[@]} -eq 0 ]; then
  have_all
  echo "$assets"
  exit 0
fi

if [ "$K8S_VERSION" != 1.20.2 ]; then
  shared="${CONFIGPIN_SHARED_K8S:-$here/../../shared/k8s}"
  unpack() {  # unpack <tarball name> <binaries...> from shared/k8s/v<version>/, checked first
    local name="$1" tarball="$shared/v$K8S_VERSION/$1" tmp b; shift
    if [ ! -f "$tarball" ]; then
      log "no $K8S_VERSION binaries: $tarball is missing (set CONFIGPIN_SHARED_K8S to the folder that holds v$K8S_VERSION/$name)"
      exit 3
    fi
    (cd "$(dirname "$tarball")" && sha256sum --quiet -c "$name.sha256") >&2 || {
      log "$tarball does not match its $name.sha256"; exit 3; }
    log "unpacking $* $K8S_VERSION"
    tmp=$(mktemp -d "$assets/.unpack.XXXXXX")
    tar -xJf "$tarball" -C "$tmp"
    for b in "$@"; do mv -f "$tmp/$b" "$assets/$b"; done
    rm -rf "$tmp"
  }
  [ -x "$assets/kube-apiserver" ] && [ -x "$assets/kube-controller-manager" ] ||
    unpack bin.tar.xz "${PLANE_BINS[@]}"
  if [ "$NODE" = 1 ] && [ -n "$(missing_bins)" ]; then unpack node.tar.xz "${NODE_BINS[@]}"; fi
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
"${apt_get[@]}" "${apt_opts[@]}" update -qq >&2

# Go 1.15 from bullseye, unpacked (not installed).
goroot="$work/go115/usr/lib/go-1.15"
if [ ! -x "$goroot/bin/go" ]; then
  log "fetching Go 1.15 from bullseye"
  (cd "$work/apt" && "${apt_get[@]}" "${apt_opts[@]}" download golang-1.15-go golang-1.15-src >&2)
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
  (cd "$src" && "${apt_get[@]}" "${apt_opts[@]}" source --download-only kubernetes >&2)
  dsc=$(ls "$src"/kubernetes_*.dsc | head -n 1)
  (cd "$src" && dpkg-source --no-check -x "$dsc" >&2)
  tree=$(ls -d "$src"/kubernetes-*/ | head -n 1)
fi
tree="${tree%/}"
log "building ${want[*]} in $(basename "$tree") (several minutes)"
gopath="$tree/.go"
mkdir -p "$gopath/src/k8s.io"
ln -sfn "$tree" "$gopath/src/k8s.io/kubernetes"
(
  cd "$gopath/src/k8s.io/kubernetes"
  export GOROOT="$goroot" GOPATH="$gopath" CGO_ENABLED=0 GOFLAGS=-mod=vendor GO111MODULE=off
  export PATH="$goroot/bin:$PATH" KUBE_GIT_VERSION="v$K8S_VERSION" KUBE_GIT_TREE_STATE=clean
  make WHAT="${want[*]/#/cmd/}" >&2
)
for b in "${want[@]}"; do
  cp -f "$tree/_output/local/go/bin/$b" "$assets/$b.tmp"
  mv -f "$assets/$b.tmp" "$assets/$b"
done
have_all
log "done"
echo "$assets"
