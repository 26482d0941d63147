#!/usr/bin/env bash
# Builds the real Kubernetes tools the tests run from the Go modules pinned under hack/, with
# the ordinary Go toolchain (no prebuilt download), one wrapper module per Kubernetes library
# tree so that each tree is compiled once (hack/README.md):
#   hack/k8s         kube-apiserver, kube-controller-manager, kubectl, kubelet, kube-proxy,
#                    kube-scheduler, etcd, helm, Prometheus' promtool
#   hack/kruise      OpenKruise's kruise-manager and kruise-daemon
#   hack/k8s-oldest  the oldest supported kube-apiserver, kruise-manager v1.8.0 (the oldest with
#                    the serverless protocol), the virtual-kubelet library's node agent with its
#                    mock provider, and vk-replacer (a provider built on it that does not notify)
#   hack/kruise-game OpenKruise Game's manager
#   hack/krew        krew and its manifest validator
# Prints, as the last line of stdout, the directory holding them. OpenKruise's install manifests
# (CRDs, RBAC, webhook configurations: `config/default` of the same module version, rendered by
# the kubectl built here) go to ../share/kruise/kruise.yaml (v1.8.0's to
# ../share/kruise-v1.8.0/kruise.yaml; OpenKruise Game's to ../share/kruise-game/kruise-game.yaml).
#
# The binaries go to a cache outside the clone, one entry per library tree, keyed by a hash of
# that tree's module (go.mod, go.sum, its own Go sources) and of the commands that build it:
# a fresh clone of the same commit reuses them, and a change to one tree's pins rebuilds that
# tree alone. The directory printed holds hard links to every tree's binaries, under a key
# made of the trees' keys. A second run returns at once (`--check` only tells whether it
# would). A lock serialises parallel callers (several test processes starting together build
# once; the others wait and reuse). Progress goes to stderr.
set -euo pipefail

hack="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${PODPROBE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/podprobe-tools}"

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

# One `go build` per call: packages compiled once per library tree (the Go build cache shares a
# package only between builds with identical sources and dependencies: hack/README.md), links in
# parallel. Each call's wall time goes to $times, which hack/setup-tests.sh prints. The
# compiler writes no DWARF (-dwarf=false): the linker strips it anyway (-s -w), and generating
# it was 15 % of a cold tree's CPU (hack/README.md).
build() { # module dir, label, ldflags, output (a file, or a directory for several), [-tags T], packages...
  local dir="$1" label="$2" ldflags="$3" out="$4" t0=$SECONDS
  shift 4
  echo "podprobe tools: go build $* in hack/$dir (cold: minutes on 2 cores)" >&2
  (cd "$hack/$dir" && GOFLAGS=-mod=readonly go build -trimpath -gcflags=all=-dwarf=false -ldflags "$ldflags" \
    -o "$out" "$@") >&2
  printf '%s\t%s\t%s\n' "$((SECONDS - t0))" "$dir" "$label" >>"$times"
}

# Each module's own install manifests, as `make manifests` + kustomize would deploy them, rendered
# by the k8s tree's kubectl.
kruise_manifests() { # module dir, module, share dir, file
  local src
  src="$(cd "$hack/$1" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' "$2")"
  mkdir -p "$share/$3"
  "$kubectl" kustomize "$src/config/default" >"$share/$3/$4" 2> >(grep -v "is deprecated" >&2)
}

# Each tree's builds: into $out (bin), $share and $work, with $times.

# hack/k8s: the Kubernetes v1.37.2 libraries. The control plane and node first (the tests'
# every control plane), then etcd, helm and promtool on the same tree. promtool only checks and
# unit-tests rules, so Prometheus' own build tag leaves its service discovery's cloud SDKs out
# (plugins/, `remove_all_sd`; file, http and kubernetes discovery stay).
tree_k8s() {
  build k8s "kube-apiserver, kube-controller-manager, kubectl, kubelet, kube-proxy, kube-scheduler" \
    "$(k8s_ldflags "$k8s_version")" "$out/" k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kube-scheduler
  build k8s "etcd" "-s -w" "$out/etcd" go.etcd.io/etcd/server/v3
  build k8s "helm" "$helm_ldflags" "$out/helm" helm.sh/helm/v3/cmd/helm
  build k8s "promtool" "-s -w" "$out/promtool" -tags remove_all_sd \
    github.com/prometheus/prometheus/cmd/promtool
  # The newest virtual-kubelet library the module proxy serves (v1.14.1, on Kubernetes v0.37.1's
  # libraries: this tree), its own node agent with the mock provider; v1.11.0 is on k8s-oldest.
  build k8s "virtual-kubelet v1.14.1" "-s -w" "$out/virtual-kubelet-v1.14.1" \
    github.com/virtual-kubelet/virtual-kubelet/cmd/virtual-kubelet
  # vk-cri (hack/k8s-oldest/vkcri, linked here as vkcri): a provider that runs its pods on a
  # node's containerd through CRI, on this tree's library v1.14.1 (the tag picks its one
  # version-specific file); the same source on v1.11.0 in k8s-oldest.
  build k8s "vk-cri on virtual-kubelet v1.14.1" "-s -w" "$out/vk-cri-v1.14.1" -tags vk_v1_14 ./vkcri
}

# hack/kruise: OpenKruise v1.9.1's tree (its own replace list, Kubernetes libraries v0.32.10).
# kruise-daemon runs PodProbeMarker probes on ordinary nodes (CRI ExecSync), for the
# side-by-side tests.
tree_kruise() {
  build kruise "kruise-manager, kruise-daemon" "-s -w" "$work/" \
    github.com/openkruise/kruise github.com/openkruise/kruise/cmd/daemon
  mv "$work/kruise" "$out/kruise-manager"
  mv "$work/daemon" "$out/kruise-daemon"
  kruise_manifests kruise github.com/openkruise/kruise kruise kruise.yaml
}

# hack/k8s-oldest: the Kubernetes v1.30.14 tree. The oldest kube-apiserver the chart supports;
# OpenKruise v1.8.0 (the first release with the serverless protocol); the virtual-kubelet
# library's own node agent (`--provider mock`: the library reports the pods' status) with the
# smallest provider that does not notify (hack/k8s-oldest/replacer: the library copies its
# status, Ready, Initialized and PodScheduled only, over the pods every 5 s, as azure-aci's does);
# vk-cri, the provider that runs its pods (hack/k8s-oldest/vkcri), on this library v1.11.0.
tree_k8s_oldest() {
  build k8s-oldest "kube-apiserver $oldest_version" "$(k8s_ldflags "$oldest_version")" \
    "$out/kube-apiserver-$oldest_version" k8s.io/kubernetes/cmd/kube-apiserver
  build k8s-oldest "kruise-manager v1.8.0, virtual-kubelet, vk-replacer, vk-cri" "-s -w" "$work/" \
    github.com/openkruise/kruise github.com/virtual-kubelet/virtual-kubelet/cmd/virtual-kubelet \
    ./replacer ./vkcri
  mv "$work/kruise" "$out/kruise-manager-v1.8.0"
  mv "$work/virtual-kubelet" "$out/virtual-kubelet"
  mv "$work/replacer" "$out/vk-replacer"
  mv "$work/vkcri" "$out/vk-cri"
  kruise_manifests k8s-oldest github.com/openkruise/kruise kruise-v1.8.0 kruise.yaml
}

# hack/kruise-game: OpenKruise Game's manager, on a tree of its own (Kubernetes libraries
# v0.31, controller-runtime v0.19: hack/README.md says why it joins neither neighbour).
tree_kruise_game() {
  build kruise-game "kruise-game-manager" "-s -w" "$out/kruise-game-manager" \
    github.com/openkruise/kruise-game
  kruise_manifests kruise-game github.com/openkruise/kruise-game kruise-game kruise-game.yaml
}

# hack/krew: krew as it installs itself (kubectl-krew), and the validator krew-index runs on
# manifests; a small tree of its own (Kubernetes libraries v0.27, seconds to build).
tree_krew() {
  build krew "kubectl-krew, validate-krew-manifest" "-s -w" "$work/" \
    sigs.k8s.io/krew/cmd/krew sigs.k8s.io/krew/cmd/validate-krew-manifest
  mv "$work/krew" "$out/kubectl-krew"
  mv "$work/validate-krew-manifest" "$out/validate-krew-manifest"
}

# The trees in build order (k8s first: its kubectl renders the others' manifests).
trees=(k8s kruise k8s-oldest kruise-game krew)

# A tree's key: its module's files (following hack/k8s/vkcri into k8s-oldest), the shell code
# that builds it with the versions that code reads, the Go toolchain that compiles it in that
# module, and for a tree whose manifests the k8s tree's kubectl renders, the k8s tree's key.
go_version="$(cd "$hack/k8s" && go env GOVERSION 2>/dev/null || echo "no go")"
tree_key() { # tree
  local fn="tree_${1//-/_}" reads
  case "$1" in
    k8s) reads="$k8s_version $helm_ldflags" ;;
    k8s-oldest) reads="$oldest_version ${keys[k8s]}" ;;
    kruise | kruise-game) reads="${keys[k8s]}" ;;
    *) reads="" ;;
  esac
  {
    (cd "$hack/$1" && find -L . \( -name go.mod -o -name go.sum -o -name '*.go' \) -type f -print |
      LC_ALL=C sort | xargs cat)
    declare -f "$fn" build
    case "$1" in k8s | k8s-oldest) declare -f k8s_ldflags ;; esac
    case "$1" in kruise | k8s-oldest | kruise-game) declare -f kruise_manifests ;; esac
    echo "$reads $go_version"
  } | sha256sum | cut -c1-16
}

declare -A keys
for tree in "${trees[@]}"; do keys[$tree]="$(tree_key "$tree")"; done
key="$(for tree in "${trees[@]}"; do echo "$tree ${keys[$tree]}"; done | sha256sum | cut -c1-16)"
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

start=$(date +%s)
rm -rf "$dest.partial"
mkdir -p "$dest.partial/bin" "$dest.partial/share"
# The builds of this run, every tree's (hack/setup-tests.sh prints them).
: >"$dest.partial/build-times.txt"
for tree in "${trees[@]}"; do
  tree_dir="$cache_root/trees/$tree-${keys[$tree]}"
  if [ ! -f "$tree_dir/complete" ]; then
    rm -rf "$tree_dir.partial"
    out="$tree_dir.partial/bin" share="$tree_dir.partial/share" work="$tree_dir.partial/work"
    times="$tree_dir.partial/build-times.txt"
    kubectl="$cache_root/trees/k8s-${keys[k8s]}/bin/kubectl"
    mkdir -p "$out" "$share" "$work"
    "tree_${tree//-/_}"
    rm -rf "$work" "$tree_dir"
    cat "$times" >>"$dest.partial/build-times.txt"
    mv "$tree_dir.partial" "$tree_dir"
    touch "$tree_dir/complete"
  fi
  # Hard links: one copy on disk, and a tree's entry removed later leaves this one whole.
  cp -al "$tree_dir/bin/." "$dest.partial/bin/"
  cp -al "$tree_dir/share/." "$dest.partial/share/"
done

rm -rf "$dest"
mv "$dest.partial" "$dest"
touch "$dest/complete"
echo "podprobe tools: built in $(($(date +%s) - start)) s into $bin" >&2
echo "$bin"
