#!/usr/bin/env bash
# Packages kubectl-podprobe for krew: one archive per platform (the binary and LICENSE, as
# krew's index requires) and the plugin manifest `podprobe.yaml` naming each archive's URL and
# sha256.
#
#   hack/krew-package.sh VERSION OUTDIR OS/ARCH=BINARY [OS/ARCH=BINARY ...]
#
# e.g. hack/krew-package.sh 0.1.0 dist linux/amd64=target/release/kubectl-podprobe
# The URLs point at the GitHub release of VERSION; KREW_BASE_URL overrides that base.
# Test a result without a registry or index:
#   KREW_ROOT=$(mktemp -d) kubectl krew install --manifest=dist/podprobe.yaml \
#     --archive=dist/kubectl-podprobe-linux-amd64.tar.gz
set -euo pipefail

if [ $# -lt 3 ]; then
  sed -n '2,12p' "$0" >&2
  exit 2
fi
version="$1" out="$2"
shift 2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
base="${KREW_BASE_URL:-https://github.com/podprobe/podprobe/releases/download/v$version}"
mkdir -p "$out"

platforms=""
for spec in "$@"; do
  target="${spec%%=*}" binary="${spec#*=}"
  os="${target%%/*}" arch="${target#*/}"
  if [ "$target" = "$spec" ] || [ -z "$os" ] || [ -z "$arch" ] || [ ! -x "$binary" ]; then
    echo "krew-package: $spec is not OS/ARCH=EXECUTABLE" >&2
    exit 2
  fi
  name="kubectl-podprobe-$os-$arch.tar.gz"
  stage="$(mktemp -d)"
  cp "$binary" "$stage/kubectl-podprobe"
  cp "$root/LICENSE" "$stage/LICENSE"
  # Reproducible: fixed owner, mode and time, sorted entries.
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$stage" \
    -cf - kubectl-podprobe LICENSE | gzip -n >"$out/$name"
  rm -rf "$stage"
  sha="$(sha256sum "$out/$name" | cut -d' ' -f1)"
  platforms+="  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: $base/$name
    sha256: $sha
    bin: kubectl-podprobe
    files:
    - from: kubectl-podprobe
      to: .
    - from: LICENSE
      to: .
"
done

cat >"$out/podprobe.yaml" <<YAML
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: podprobe
spec:
  version: v$version
  homepage: https://github.com/podprobe/podprobe
  shortDescription: Show PodProbeMarker probes, conditions and markers
  description: |
    Shows every pod's OpenKruise PodProbeMarker probes with their pod conditions,
    ages and markers, and warns about missing or stale conditions, invalid probes,
    a missing sidecar, non-serverless nodes and out-of-date annotations
    (kubectl podprobe get). Explains, for one pod, the chain from PodProbeMarker to
    marker link by link and where it breaks (kubectl podprobe explain POD).
    Works with OpenKruise's kruise-manager and with podprobe-manager.
  platforms:
$platforms
YAML
echo "$out/podprobe.yaml"
