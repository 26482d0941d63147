# Timed steps for hack/setup-tests.sh and .ci/run (sourced, not run): every run shows where its
# time goes.
#
#   step NAME COMMAND...   runs COMMAND; prints "== NAME" before it and "-- NAME: N s" after,
#                          with how busy the machine's cores were meanwhile
#   steps_report TITLE     prints every step's time in a table, and the total
#
# A failing step is reported with its time, then its exit status ends the script.
#
# "cores busy" is the machine's, from /proc/stat (everything running, not only the step): near
# the core count, a step is bound by CPU and only less work makes it shorter; well below it, a
# step waits (on the network, a lock, a timer, one thread) and overlapping work would fill it.

steps_names=()
steps_seconds=()
steps_busy=()
steps_start=$SECONDS

# Busy and total jiffies of all cores since boot: "BUSY TOTAL".
cpu_jiffies() {
  awk '/^cpu / { total = 0; for (i = 2; i <= NF; i++) total += $i; print total - $5 - $6, total }' /proc/stat
}

# The cores /proc/stat counts: all of the machine's, which nproc need not be (an affinity mask).
stat_cores() { grep -c '^cpu[0-9]' /proc/stat; }

# Cores busy on average between two cpu_jiffies readings.
cores_busy() { # "BUSY TOTAL" before, "BUSY TOTAL" after
  local before=($1) after=($2) cores
  cores="$(stat_cores)"
  awk -v b="$((after[0] - before[0]))" -v t="$((after[1] - before[1]))" -v n="$cores" \
    'BEGIN { if (t > 0) printf "%.2f", n * b / t; else printf "-" }'
}

step() {
  local name="$1" start=$SECONDS status=0 jiffies busy
  shift
  echo "== $name"
  jiffies="$(cpu_jiffies)"
  "$@" || status=$?
  busy="$(cores_busy "$jiffies" "$(cpu_jiffies)")"
  steps_names+=("$name")
  steps_seconds+=($((SECONDS - start)))
  steps_busy+=("$busy")
  echo "-- $name: $((SECONDS - start)) s, $busy of $(stat_cores) cores busy"
  if [ "$status" -ne 0 ]; then
    echo "step '$name' failed (exit $status)" >&2
    steps_report "up to the failed step"
    exit "$status"
  fi
}

steps_report() {
  local i
  echo "== time per step ($1; cores busy of $(stat_cores))"
  for i in "${!steps_names[@]}"; do
    printf '   %-40s %6d s  %5s\n' "${steps_names[$i]}" "${steps_seconds[$i]}" "${steps_busy[$i]}"
  done
  printf '   %-40s %6d s\n' "total" $((SECONDS - steps_start))
}
