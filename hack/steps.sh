# Timed steps for hack/setup-tests.sh and .ci/run (sourced, not run): every run shows where its
# time goes.
#
#   step NAME COMMAND...   runs COMMAND; prints "== NAME" before it and "-- NAME: N s" after
#   steps_report TITLE     prints every step's time in a table, and the total
#
# A failing step is reported with its time, then its exit status ends the script.

steps_names=()
steps_seconds=()
steps_start=$SECONDS

step() {
  local name="$1" start=$SECONDS status=0
  shift
  echo "== $name"
  "$@" || status=$?
  steps_names+=("$name")
  steps_seconds+=($((SECONDS - start)))
  echo "-- $name: $((SECONDS - start)) s"
  if [ "$status" -ne 0 ]; then
    echo "step '$name' failed (exit $status)" >&2
    steps_report "up to the failed step"
    exit "$status"
  fi
}

steps_report() {
  local i
  echo "== time per step ($1)"
  for i in "${!steps_names[@]}"; do
    printf '   %-40s %6d s\n' "${steps_names[$i]}" "${steps_seconds[$i]}"
  done
  printf '   %-40s %6d s\n' "total" $((SECONDS - steps_start))
}
