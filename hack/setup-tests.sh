#!/usr/bin/env bash
# Everything the test suite needs on a fresh machine of this project's kind (Rust by rustup,
# Go, Debian): the README's test command is `hack/setup-tests.sh && cargo nextest run
# --workspace`. Idempotent; a warm machine passes through in seconds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

nextest_version="0.9.151"
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "== cargo-nextest $nextest_version (built from crates.io: about 12 minutes on 2 cores)"
  cargo install cargo-nextest --version "$nextest_version" --locked
fi

echo "== Debian packages: capsh (procfs exec without CAP_SYS_PTRACE), the node tests' containerd, runc,"
echo "   CNI plugins, iptables (kube-proxy), busybox-static, buildah (images), qemu-user-static (arm64 binaries)"
missing=()
for tool in containerd runc iptables buildah qemu-aarch64-static; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
[ -x /usr/sbin/capsh ] || [ -x /sbin/capsh ] || [ -x /usr/bin/capsh ] || missing+=(libcap2-bin)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq "${missing[@]//qemu-aarch64-static/qemu-user-static}"
fi

echo "== static (musl) builds for both image architectures: Rust targets, musl-gcc, the cross gcc"
hack/build-static.sh --toolchain amd64
hack/build-static.sh --toolchain arm64

echo "== fuzzing (hack/fuzz-smoke.sh): the pinned nightly toolchain and cargo-fuzz"
rustup toolchain install "$(cat hack/fuzz-toolchain)" --profile minimal
cargo_fuzz_version="0.13.2"
if ! cargo fuzz --version 2>/dev/null | grep -q "$cargo_fuzz_version"; then
  cargo install cargo-fuzz --version "$cargo_fuzz_version" --locked
fi

echo "== kube-apiserver, etcd, kubectl, kubelet, helm from the pinned Go modules (hack/README.md)"
hack/build-tools.sh
