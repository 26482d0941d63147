#!/usr/bin/env bash
# Writes a single-layer OCI image archive (an OCI image layout in a tar) from a root
# filesystem directory, with umoci: no registry and no container engine needed. containerd
# imports it (`ctr -n k8s.io images import --base-name REPO OUT.tar`), as do podman and skopeo
# (`oci-archive:OUT.tar:TAG`).
#
#   hack/oci-image.sh OUT.tar TAG ROOTFS [umoci config flags...]
#
# e.g. hack/oci-image.sh sidecar.tar dev rootfs/ --config.user=65532:65532 \
#        --config.entrypoint=/usr/local/bin/podprobe --config.cmd=run
#
# The layer's files are owned by root unless ROOTFS says otherwise; timestamps are kept.
set -euo pipefail

if [ $# -lt 3 ]; then
  echo "usage: $0 OUT.tar TAG ROOTFS [umoci config flags...]" >&2
  exit 2
fi
out="$1" tag="$2" rootfs="$3"
shift 3
command -v umoci >/dev/null || { echo "oci-image: umoci is not installed (Debian: apt-get install umoci)" >&2; exit 1; }
[ -d "$rootfs" ] || { echo "oci-image: $rootfs is not a directory" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
layout="$work/layout"
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
# unpack + repack (not `insert`, whose layer names files from `/` and ends without the tar
# end-of-archive blocks): one layer with the root filesystem's files, owners and modes.
umoci unpack --image "$layout:$tag" "$work/bundle" >/dev/null
cp -a "$rootfs"/. "$work/bundle/rootfs/"
umoci repack --image "$layout:$tag" "$work/bundle"
umoci config --image "$layout:$tag" --os=linux "$@"
umoci gc --layout "$layout"
tar -C "$layout" -cf "$out.partial" .
mv "$out.partial" "$out"
