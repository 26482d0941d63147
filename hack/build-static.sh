#!/usr/bin/env bash
# The two shipped binaries, static (musl), for one architecture: what the Dockerfile's
# `binaries` stage runs, what the tests and hack/release.sh build the images from.
#
#   hack/build-static.sh --toolchain ARCH   install what building for ARCH needs (Debian, rustup)
#   hack/build-static.sh ARCH OUT           build into OUT/podprobe, OUT/podprobe-agent and
#                                           OUT/podprobe-manager
#   hack/build-static.sh ARCH OUT --plugin  also OUT/kubectl-podprobe (the release's krew archives)
#
# ARCH is Docker's TARGETARCH: amd64 or arm64, from either host (Debian's cross gcc compiles
# ring's C and assembly and links). CARGO_TARGET_DIR is honoured.
#   podprobe          --profile sidecar --no-default-features (size first: it runs in every pod)
#   podprobe-agent    the same build, linked non-PIE (the exec agent the sidecar image carries)
#   podprobe-manager  --profile manager (release, stripped)
#   kubectl-podprobe  --profile manager, in the manager's cargo invocation (below)
# Each build has a stamp of its own: it is rebuilt only when its own inputs change. Each is
# built with cargo-auditable, which embeds its crate list (names, versions, sources) in the
# binary: image scanners (syft, trivy, grype) then see the Rust dependencies of a static
# binary, and hack/release.sh's SBOMs are read from the shipped binaries themselves.
auditable_version=0.7.7
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() { echo "usage: $0 --toolchain ARCH | $0 ARCH OUT [--plugin]   (ARCH: amd64 or arm64)" >&2; exit 2; }

host_arch() {
  case "$(uname -m)" in
    x86_64) echo amd64 ;;
    aarch64) echo arm64 ;;
    *) echo "build-static: unsupported host $(uname -m)" >&2; exit 1 ;;
  esac
}

# The Rust target, and the Debian C compiler for it (musl-gcc on the same architecture,
# the GNU cross compiler otherwise: ring needs only freestanding headers from it).
select_arch() {
  case "$1" in
    amd64) target=x86_64-unknown-linux-musl; cross_gcc=x86_64-linux-gnu-gcc; cross_pkgs="gcc-x86-64-linux-gnu libc6-dev-amd64-cross" ;;
    arm64) target=aarch64-unknown-linux-musl; cross_gcc=aarch64-linux-gnu-gcc; cross_pkgs="gcc-aarch64-linux-gnu libc6-dev-arm64-cross" ;;
    *) echo "build-static: unknown architecture '$1' (amd64 or arm64)" >&2; exit 2 ;;
  esac
  if [ "$1" = "$(host_arch)" ]; then cc=musl-gcc; pkgs=musl-tools; else cc=$cross_gcc; pkgs=$cross_pkgs; fi
}

# cargo-auditable's own --version prints cargo's: ask cargo which one is installed, and whether
# its binary is still there (cargo's list outlives a deleted binary).
has_auditable() {
  command -v cargo-auditable >/dev/null &&
    cargo install --list | grep -q "^cargo-auditable v$auditable_version:"
}

if [ "${1:-}" = "--toolchain" ]; then
  [ $# -eq 2 ] || usage
  select_arch "$2"
  rustup target add "$target"
  if ! has_auditable; then
    cargo install --locked --quiet --force cargo-auditable --version "$auditable_version"
  fi
  if ! command -v "$cc" >/dev/null; then
    apt-get update -qq
    # shellcheck disable=SC2086 # a list of packages
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $pkgs
  fi
  exit 0
fi

plugin=0
case "$#:${3:-}" in
  2:) ;;
  3:--plugin) plugin=1 ;;
  *) usage ;;
esac
arch="$1" out="$2"
select_arch "$arch"
command -v "$cc" >/dev/null || { echo "build-static: $cc not found: run $0 --toolchain $1" >&2; exit 1; }
has_auditable ||
  { echo "build-static: cargo-auditable $auditable_version not found: run $0 --toolchain $1" >&2; exit 1; }
if [ "$cc" != musl-gcc ]; then
  # cc-rs and rustc find musl-gcc by themselves; a cross compiler has to be named.
  env_target="$(echo "$target" | tr 'a-z-' 'A-Z_')"
  export "CARGO_TARGET_${env_target}_LINKER=$cc" "CC_${target//-/_}=$cc"
fi

# Everything a binary is built from: the toolchain, compiler and flags, this script, the lock
# file, every manifest, the shared crates' sources (protocol, ops) and its own crates'. Each
# binary keeps that key beside it in the target directory (with its hash, so a build by other
# means is noticed); the same key skips cargo, which in a fresh clone (new file times) would
# rebuild and redo its fat LTO, minutes, although nothing changed. One key per binary: a change
# to the sidecar alone rebuilds neither the manager nor the plugin.
inputs_key() { # the binary's own source directories
  {
    rustc -vV
    echo "$target $cc ${RUSTFLAGS:-} ${CARGO_ENCODED_RUSTFLAGS:-}"
    {
      find hack/build-static.sh Cargo.lock protocol ops "$@" -type f
      # Pruned, not filtered: a target directory's contents change while builds run beside
      # this one (the other architecture's in the background), and find fails on an entry
      # that vanished under it.
      find . \( -name target -o -name .git \) -prune -o -name Cargo.toml -type f -print
    } | LC_ALL=C sort | xargs -r sha256sum
  } | sha256sum | cut -c1-32
}

# A cross build has a target directory of its own inside the given one: cargo locks a whole
# profile directory (the host's too, for build scripts) while it builds, and hack/setup-tests.sh
# builds the other architecture at the lowest priority while the tests build and run this
# machine's (the test game server, the images): one cargo must never wait on the other.
target_dir="${CARGO_TARGET_DIR:-target}"
if [ "$arch" != "$(host_arch)" ]; then
  target_dir="$target_dir/cross-$arch"
fi
export CARGO_TARGET_DIR="$target_dir"
mkdir -p "$target_dir"
# One build of an architecture at a time, whoever asks (hack/setup-tests.sh's background
# build, a test, hack/release.sh): a second caller waits, then finds the binaries current.
# PODPROBE_STATIC_LOCK_FD=7: the caller took this lock and passed it on as fd 7
# (hack/setup-tests.sh, so that no test can start the same build first).
if [ "${PODPROBE_STATIC_LOCK_FD:-}" != 7 ]; then
  exec 7>"$target_dir/build-static-$arch.lock"
fi
if ! flock -n 7; then
  echo "build-static: waiting for another $arch build ($target_dir/build-static-$arch.lock)" >&2
  flock 7
fi
# The key, then the binaries' hashes.
stamp_of() { # key, binaries...
  echo "$1"
  shift
  sha256sum "$@" 2>/dev/null | cut -d' ' -f1
}

# Builds unless the stamp says these binaries were built from these inputs: NAME STAMP
# SOURCES... -- BINARIES... -- CRATES... -- CARGO-BUILD-COMMANDS (one per argument). With
# CHECK_ONLY set, only answers whether they are current (exit 0) or would be built (exit 1).
build_if_changed() {
  local name="$1" stamp="$target_dir/$target/$2" sources=() binaries=() crates=() key command
  shift 2
  while [ "$1" != -- ]; do sources+=("$1"); shift; done
  shift
  while [ "$1" != -- ]; do binaries+=("$target_dir/$target/$1"); shift; done
  shift
  while [ "$1" != -- ]; do crates+=(-p "$1"); shift; done
  shift
  key="$(inputs_key "${sources[@]}")"
  if [ -n "${CHECK_ONLY:-}" ]; then # only whether it is current, quietly
    [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(stamp_of "$key" "${binaries[@]}")" ]
    return
  fi
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(stamp_of "$key" "${binaries[@]}")" ]; then
    echo "build-static: the $arch $name binaries are current (their inputs are unchanged): not running cargo"
  else
    rm -f "$stamp"
    # New inputs: the workspace's own crates are rebuilt whatever their file times say. Cargo
    # trusts times, and a build from another checkout into this target directory (CI's clone,
    # a second work tree) can be newer than an edit here: cargo kept the old binary and this
    # script recorded it under the new key, so a test ran stale code.
    for command in "$@"; do # each command's profile: "build|rustc --profile NAME ..."
      command="${command#* --profile }"
      cargo clean --quiet --target "$target" --profile "${command%% *}" "${crates[@]}"
    done
    for command in "$@"; do
      # shellcheck disable=SC2086 # one command's words
      cargo auditable ${command%% *} --locked --target "$target" ${command#* }
    done
    stamp_of "$key" "${binaries[@]}" >"$stamp"
  fi
  # Replaced by rename, never overwritten in place: a test may be running the previous copy
  # (overwriting a running executable fails with ETXTBSY).
  local binary
  for binary in "${binaries[@]}"; do
    cp "$binary" "$out/.$(basename "$binary").new"
    mv -f "$out/.$(basename "$binary").new" "$out/$(basename "$binary")"
  done
}

mkdir -p "$out"
# The sidecar (examples/game-server-pod.yaml: its `check` command's built-in example), and the
# exec agent alone, which the sidecar image carries for the injected init container to copy
# into app containers. The agent is linked as a non-PIE static executable: a static PIE
# relocates its pointer tables at start, and those pages (170 KiB) become anonymous memory,
# charged to the game container once per agent process. It shares the sidecar's library
# build (same profile and features): one compilation, two links.
build_if_changed sidecar podprobe-static.inputs src examples/game-server-pod.yaml -- \
  sidecar/podprobe sidecar/podprobe-agent -- \
  podprobe podprobe-protocol podprobe-ops -- \
  "build --profile sidecar --no-default-features -p podprobe --bin podprobe" \
  "rustc --profile sidecar --no-default-features -p podprobe --bin podprobe-agent -- -C relocation-model=static"
# The manager, with the plugin when asked, in one cargo invocation. Built apart, the plugin's
# dependencies compiled a second time (rustls, hyper, tracing, kube and twenty more, with fewer
# features enabled: 1-2 minutes per architecture when cold). The plugin's features of every
# dependency are a subset of the manager's (`cargo tree -e features`), so built together the
# manager is compiled from exactly what it is alone, and the plugin from the manager's crates.
manager_alone=(manager podprobe-manager-static.inputs model manager/src --
  manager/podprobe-manager --
  podprobe-manager podprobe-model podprobe-protocol podprobe-ops --
  "build --profile manager -p podprobe-manager --bin podprobe-manager")
manager_and_plugin=("manager and plugin" podprobe-manager-plugin-static.inputs model manager/src
  kubectl-podprobe/src --
  manager/podprobe-manager manager/kubectl-podprobe --
  podprobe-manager kubectl-podprobe podprobe-model podprobe-protocol podprobe-ops --
  "build --profile manager -p podprobe-manager -p kubectl-podprobe --bin podprobe-manager --bin kubectl-podprobe")
if [ "$plugin" = 1 ] || CHECK_ONLY=1 build_if_changed "${manager_and_plugin[@]}"; then
  # Without --plugin, a current build of both (hack/setup-tests.sh's) serves the manager
  # rather than building it again alone; OUT then holds the plugin too.
  build_if_changed "${manager_and_plugin[@]}"
else
  build_if_changed "${manager_alone[@]}"
fi
