#!/usr/bin/env bash
# A bounded run of every fuzz target (fuzz/fuzz_targets, libFuzzer through cargo fuzz) from its
# committed seeds: FUZZ_SECONDS each (default 60). Prints executions and coverage per target;
# fails on the first crash, leaving the input in fuzz/artifacts/<target>/ (turn it into a
# regression test). Installs what it needs first: the pinned nightly (hack/fuzz-toolchain) and
# cargo-fuzz (hack/cargo-tool.sh). CI does not run it: the test suite replays every committed
# input (fuzz/tests/replay.rs); this explores new ones.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds="${FUZZ_SECONDS:-60}"
toolchain="$(cat hack/fuzz-toolchain)"
# Built outside the clone, like the Go tools: instrumented dependencies take minutes to build.
target_dir="${PODPROBE_FUZZ_TARGET_DIR:-$HOME/.cache/podprobe-fuzz/target}"
# Coverage instrumentation only: the targets are safe Rust, so panics and assertion failures
# are what they can find; no sanitizer runtime needed.
rustup toolchain install "$toolchain" --profile minimal
hack/cargo-tool.sh fuzz
# The workspace's release profile has thin LTO for the shipped binaries; an instrumented fuzz
# binary needs none, and six of them would each spend minutes in it.
export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
fuzz=(cargo "+$toolchain" fuzz)
# The libFuzzer binaries are behind the fuzz crate's `libfuzzer` feature (the workspace builds
# only its properties).
flags=(--sanitizer none --release --debug-assertions --features libfuzzer --target-dir "$target_dir")

"${fuzz[@]}" build "${flags[@]}"
summary=()
for target in $("${fuzz[@]}" list); do
  log="$(mktemp)"
  if ! "${fuzz[@]}" run "${flags[@]}" "$target" "fuzz/corpus/$target" -- \
      -max_total_time="$seconds" -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz target $target failed: the input is in fuzz/artifacts/$target/" >&2
    exit 1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*' || echo "?")
  corpus=$(ls "fuzz/corpus/$target" | wc -l)
  summary+=("$(printf '%-18s %12s executions  %6s edges covered  %6s corpus entries' "$target" "$runs" "$cov" "$corpus")")
  rm -f "$log"
done
echo "== fuzz smoke, ${seconds} s per target"
printf '%s\n' "${summary[@]}"
