#!/usr/bin/env bash
# Builds the real Kubernetes tools the tests run (kube-apiserver, kube-controller-manager,
# kubectl, kubelet, kube-proxy, kube-scheduler, etcd, helm, OpenKruise's kruise-manager and kruise-daemon (the current release and
# v1.8.0, the oldest with the serverless protocol), OpenKruise Game's manager, krew and its manifest validator,
# Prometheus' promtool, the oldest supported kube-apiserver, and the virtual-kubelet library's
# own node agent with its mock provider, and vk-replacer: a provider built on it that does not notify) from the Go modules pinned in
# hack/{k8s,k8s-oldest,etcd,helm,kruise,kruise-1.8,kruise-game,krew,prometheus,virtual-kubelet}, with the ordinary Go toolchain: no
# prebuilt download. Prints, as the last line of stdout, the directory holding them.
# OpenKruise's install manifests (CRDs, RBAC, webhook configurations: `config/default` of the
# same module version, rendered by the kubectl built here) go to ../share/kruise/kruise.yaml
# (v1.8.0's to ../share/kruise-v1.8.0/kruise.yaml; OpenKruise Game's to
# ../share/kruise-game/kruise-game.yaml).
#
# The binaries go to a cache outside the clone, keyed by a hash of the pinned modules and this
# script, so a fresh clone of the same commit reuses them and a version bump rebuilds. A second
# run returns at once (`--check` only tells whether it would). A lock serialises parallel
# callers (several test processes starting together build once; the others wait and reuse).
# Progress goes to stderr.
set -euo pipefail

hack="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${PODPROBE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/podprobe-tools}"

key="$(cat "$hack"/k8s/go.mod "$hack"/k8s/go.sum "$hack"/etcd/go.mod "$hack"/etcd/go.sum \
  "$hack"/helm/go.mod "$hack"/helm/go.sum "$hack"/kruise/go.mod "$hack"/kruise/go.sum \
  "$hack"/kruise-1.8/go.mod "$hack"/kruise-1.8/go.sum \
  "$hack"/kruise-game/go.mod "$hack"/kruise-game/go.sum \
  "$hack"/krew/go.mod "$hack"/krew/go.sum "$hack"/prometheus/go.mod "$hack"/prometheus/go.sum \
  "$hack"/k8s-oldest/go.mod "$hack"/k8s-oldest/go.sum \
  "$hack"/virtual-kubelet/go.mod "$hack"/virtual-kubelet/go.sum "$hack"/virtual-kubelet/replacer/main.go \
  "$hack"/build-tools.sh | sha256sum | cut -c1-16)"
dest="$cache_root/$key"
bin="$dest/bin"

# Fast path: a finished build (the stamp is written last, after every binary is in place).
# `--check` only answers whether there is one (exit 1 when a build would be needed).
if [ -f "$dest/complete" ]; then
  echo "$bin"
  exit 0
fi
[ "${1:-}" != "--check" ] || exit 1

mkdir -p "$cache_root"
exec 9>"$cache_root/build.lock"
echo "podprobe tools: waiting for the build lock ($cache_root/build.lock)" >&2
flock 9
if [ -f "$dest/complete" ]; then # another caller built it while we waited
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { echo "podprobe tools: the Go toolchain (go) is not installed" >&2; exit 1; }

k8s_version="v1.37.2"
# The oldest kube-apiserver the chart supports (Chart.yaml's kubeVersion), for the
# compatibility tests: named by its version beside the current one.
oldest_version="v1.30.14"
helm_version="v3.22.0"
# Release builds stamp their version through ldflags (Kubernetes' hack/lib/version.sh): without
# it kube-apiserver and kubectl report v0.0.0, which clients and helm's kubeVersion checks read.
k8s_ldflags() { # vMAJOR.MINOR.PATCH
  local minor flags="-s -w" pkg
  minor="$(echo "$1" | cut -d. -f2)"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$1 -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"

rm -rf "$dest.partial"
mkdir -p "$dest.partial/bin"
build() { # module dir, ldflags, output (a file, or the bin dir for several), packages...
  local dir="$1" ldflags="$2" out="$3"
  shift 3
  echo "podprobe tools: go build $* (cold: minutes on 2 cores)" >&2
  (cd "$hack/$dir" && GOFLAGS=-mod=readonly go build -trimpath -ldflags "$ldflags" \
    -o "$out" "$@") >&2
}
start=$(date +%s)
build k8s "$(k8s_ldflags "$k8s_version")" "$dest.partial/bin/" k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kube-scheduler
build k8s-oldest "$(k8s_ldflags "$oldest_version")" "$dest.partial/bin/kube-apiserver-$oldest_version" \
  k8s.io/kubernetes/cmd/kube-apiserver
build etcd "-s -w" "$dest.partial/bin/etcd" go.etcd.io/etcd/server/v3
build helm "$helm_ldflags" "$dest.partial/bin/helm" helm.sh/helm/v3/cmd/helm
build kruise "-s -w" "$dest.partial/bin/kruise-manager" github.com/openkruise/kruise
# kruise-daemon: PodProbeMarker probes on ordinary nodes (CRI ExecSync), for the side-by-side tests.
build kruise "-s -w" "$dest.partial/bin/kruise-daemon" github.com/openkruise/kruise/cmd/daemon
build kruise-1.8 "-s -w" "$dest.partial/bin/kruise-manager-v1.8.0" github.com/openkruise/kruise
build kruise-game "-s -w" "$dest.partial/bin/kruise-game-manager" github.com/openkruise/kruise-game
# krew as it installs itself (kubectl-krew), and the validator krew-index runs on manifests.
build krew "-s -w" "$dest.partial/bin/kubectl-krew" sigs.k8s.io/krew/cmd/krew
build krew "-s -w" "$dest.partial/bin/validate-krew-manifest" \
  sigs.k8s.io/krew/cmd/validate-krew-manifest
# promtool, which checks the chart's alert rules and evaluates them on the binaries' metrics.
build prometheus "-s -w" "$dest.partial/bin/promtool" github.com/prometheus/prometheus/cmd/promtool
# The node agent serverless providers build on (`--provider mock`: no containers; the library
# reports the pods' status), to run podprobe beside what the library does to pod status.
build virtual-kubelet "-s -w" "$dest.partial/bin/virtual-kubelet" \
  github.com/virtual-kubelet/virtual-kubelet/cmd/virtual-kubelet
# The smallest provider that does not notify (hack/virtual-kubelet/replacer): the library copies
# its status (Ready, Initialized, PodScheduled only) over the pods every 5 s, as azure-aci's does.
build virtual-kubelet "-s -w" "$dest.partial/bin/vk-replacer" ./replacer

# Each module's own install manifests, as `make manifests` + kustomize would deploy them.
kruise_manifests() { # module dir, module, share dir, file
  local src
  src="$(cd "$hack/$1" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' "$2")"
  mkdir -p "$dest.partial/share/$3"
  "$dest.partial/bin/kubectl" kustomize "$src/config/default" \
    >"$dest.partial/share/$3/$4" 2> >(grep -v "is deprecated" >&2)
}
kruise_manifests kruise github.com/openkruise/kruise kruise kruise.yaml
kruise_manifests kruise-1.8 github.com/openkruise/kruise kruise-v1.8.0 kruise.yaml
kruise_manifests kruise-game github.com/openkruise/kruise-game kruise-game kruise-game.yaml

rm -rf "$dest"
mv "$dest.partial" "$dest"
touch "$dest/complete"
echo "podprobe tools: built in $(($(date +%s) - start)) s into $bin" >&2
echo "$bin"
