# bench_common.sh — what the benchmark scripts share (sourced, not run): waiting for a quiet machine before measuring.

# The 1-minute load average.
load1() { cut -d' ' -f1 /proc/loadavg; }

# wait_for_load_below MAX_LOAD WAIT_S: polls every 30 s, at most WAIT_S seconds in all, until the 1-minute load average
# is below MAX_LOAD (then the caller measures anyway); returns at once when MAX_LOAD is empty.
wait_for_load_below() {
  local max_load=$1 wait_s=$2 waited=0
  [[ -z $max_load ]] && return 0
  while awk -v l="$(load1)" -v m="$max_load" 'BEGIN{exit !(l >= m)}' && (( waited < wait_s )); do
    echo "== load average $(load1) >= $max_load; waiting (${waited}s of at most ${wait_s}s)" >&2
    sleep 30; waited=$((waited + 30))
  done
}
