#!/usr/bin/env bash
# A release: both images for linux/amd64 and linux/arm64 as multi-arch manifest lists, the
# chart packaged with helm, and the kubectl plugin for both as krew archives with their manifest.
#
#   hack/release.sh                       build; push to $REGISTRY (docker://REGISTRY/NAME:VERSION)
#   hack/release.sh --no-push             build only (the lists stay in buildah's storage)
#   hack/release.sh --dest oci:DIR        write OCI layouts DIR/podprobe and DIR/podprobe-manager
#
#   REGISTRY  where the images go (default ghcr.io/podprobe, the chart's default); log in first
#             with `buildah login REGISTRY`
#   VERSION   the tag (default: the chart's appVersion, which the chart's image tags follow)
#   OUT       the chart package, the binaries, images.txt (each image list by digest,
#             REF@sha256:..., when pushed or written), and the plugin's release assets (default
#             target/dist: not cargo's target/release): kubectl-podprobe-linux-ARCH.tar.gz and
#             podprobe.yaml, krew's manifest (hack/krew-package.sh; URLs under the GitHub release
#             vVERSION unless KREW_BASE_URL says otherwise), to attach to that release
#
# Needs buildah, helm, and what `hack/build-static.sh --toolchain amd64|arm64` installs. The
# binaries are cross-compiled on this machine with hack/build-static.sh, and the images built
# from the Dockerfile's `sidecar` and `manager` stages with that output as the `binaries` stage
# (--build-context): the same stages the tests build and run. A machine with docker buildx
# instead can build the whole Dockerfile (README "Install").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

push=docker dest=""
case "${1:-}" in
  "") ;;
  --no-push) push=none ;;
  --dest) [ $# -eq 2 ] || { echo "usage: $0 [--no-push | --dest TRANSPORT:PATH]" >&2; exit 2; }; push=dest; dest="$2" ;;
  *) echo "usage: $0 [--no-push | --dest TRANSPORT:PATH]" >&2; exit 2 ;;
esac
case "$dest" in
  # Local destinations: the images go into this directory, which has to exist.
  oci:* | oci-archive:* | dir:*) mkdir -p "${dest#*:}" ;;
esac
registry="${REGISTRY:-ghcr.io/podprobe}"
version="${VERSION:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/podprobe/Chart.yaml)}"
out="${OUT:-target/dist}"
helm="${HELM:-helm}"
for tool in buildah "$helm"; do
  command -v "$tool" >/dev/null || { echo "release: $tool is not installed" >&2; exit 1; }
done

for arch in amd64 arm64; do
  echo "== binaries for $arch (hack/build-static.sh)"
  hack/build-static.sh "$arch" "$out/$arch/dist" --plugin
done

mkdir -p "$out"
rm -f "$out/images.txt"
for image in podprobe:sidecar podprobe-manager:manager; do
  name="${image%%:*}" stage="${image##*:}"
  list="$registry/$name:$version"
  echo "== $list: the Dockerfile's $stage stage for linux/amd64 and linux/arm64"
  buildah manifest rm "$list" >/dev/null 2>&1 || true
  buildah manifest create "$list" >/dev/null
  for arch in amd64 arm64; do
    buildah build --quiet --platform "linux/$arch" --target "$stage" \
      --build-context "binaries=$out/$arch" --manifest "$list" .
  done
  # The pushed list's digest: what users pin (REF@sha256:...), listed in $out/images.txt.
  digest="$out/$name.digest"
  case "$push" in
    docker) buildah manifest push --all --digestfile "$digest" "$list" "docker://$list" ;;
    dest) buildah manifest push --all --digestfile "$digest" "$list" "${dest%/}/$name:$version" ;;
    none) ;;
  esac
  if [ -f "$digest" ]; then
    echo "$list@$(cat "$digest")" >>"$out/images.txt"
  fi
done
[ ! -f "$out/images.txt" ] || { echo "== released images, by digest ($out/images.txt)"; cat "$out/images.txt"; }

echo "== chart (helm package)"
"$helm" package charts/podprobe --destination "$out"

echo "== kubectl plugin: krew archives and manifest (hack/krew-package.sh)"
hack/krew-package.sh "$version" "$out" \
  "linux/amd64=$out/amd64/dist/kubectl-podprobe" "linux/arm64=$out/arm64/dist/kubectl-podprobe"
