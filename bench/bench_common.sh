# bench_common.sh — what the benchmark scripts share (sourced, not run): the record's header (CPU, commit, load) and
# waiting for a quiet machine before measuring.

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

# The CPU's model and the flags that decide matmul speed ("AMD EPYC 7B13 (avx fma avx2)"), for a record's header.
cpu_description() {
  local flags
  flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx|avx2|fma|avx512f|avx512_bf16|amx_bf16)$' |
    tr '\n' ' ' | sed 's/ $//')
  echo "$(lscpu | sed -n 's/^Model name: *//p' | head -n 1) (${flags:-none of avx fma avx2 avx512f avx512_bf16 amx_bf16})"
}

# The short commit of the checkout at $1, with " (with uncommitted changes)" when its tracked files differ.
source_commit() {
  local commit
  commit=$(git -C "$1" rev-parse --short HEAD 2>/dev/null || echo unknown)
  [[ -n $(git -C "$1" status --porcelain --untracked-files=no 2>/dev/null) ]] && commit+=" (with uncommitted changes)"
  echo "$commit"
}

# q QUICK_VALUE NORMAL_VALUE: the first under QUICK=1 (a bench's quick mode, about 2 minutes on 2 cores), else the
# second.
q() { [[ ${QUICK:-0} == 1 ]] && echo "$1" || echo "$2"; }
