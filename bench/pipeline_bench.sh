#!/usr/bin/env bash
# pipeline_bench.sh — slow links, measured: 2 hosts x 2 devices, each host process in its own network namespace, the
# two namespaces joined by one veth pair whose both ends are shaped with tc, so the veth link is exactly the slow
# "DCN" link between the two slices (the 2 devices of a host talk through memory, in-process). The same model, global
# batch and steps in three layouts, each host one stage in the third:
#   fsdp over both links     ici_mesh.fsdp=2 dcn_mesh.fsdp=2
#   data over DCN            ici_mesh.fsdp=2 dcn_mesh.data=2
#   pipeline over DCN        ici_mesh.fsdp=2 dcn_mesh.pipeline=2 pipeline.schedule=1f1b pipeline.microbatches=MICRO
# Prints, per layout: step time (median [min-max] over the steps after WARMUP), the bytes that crossed the slow link
# per step (measured on the veth: its tx + rx byte counters, both directions, sampled as host 0 writes each step's
# metrics.jsonl line, so the steady-state figure leaves out start-up and the final checkpoint; the whole run's
# counter / steps is printed too), the same figure derived from device 0's comm_bytes (the model is printed with it),
# the losses (which must agree between the layouts within LOSS_RTOL relative at every step, else it exits 1), and for
# the pipeline the bubble (pipeline_bubble_fraction, per-stage pipeline_bubble_s) against the ideal (S-1)/(M+S-1).
#
#   bench/pipeline_bench.sh [BUILD_DIR]          default BUILD_DIR: build (the directory holding meshtrain)
#   QUICK=1 bench/pipeline_bench.sh              a small run (fewer steps, shorter rows), about 1-2 minutes on 2 cores
#
# Needs root, `ip netns` and `tc` (iproute2), taskset and python3.
#
# The link: `tc qdisc ... root netem delay LATENCY rate BANDWIDTH` on both veth ends when the kernel has sch_netem;
# without it (CONFIG_NET_SCH_NETEM unset, as on some VM kernels) both ends get `tbf rate BANDWIDTH burst BURST` and the
# latency is NOT emulated: the script says so and prints the measured round trip instead. Before the runs it measures
# the link (TCP round trip and goodput between the namespaces) and prints both.
#
# Environment (defaults; QUICK=1 changes those marked q:):
#   MODEL=llama-10m GBS=16 BLOCK=128 STEPS=8   model config name, global batch rows, tokens per row, optimizer steps
#     (q: llama-10m 16 64 4)
#   MICRO=8                                    pipeline.microbatches (must divide the rows per device: GBS / 2)
#   WARMUP=2 (q: 1)                            first steps left out of the medians and the steady-state bytes
#   ROUNDS=2 (q: 1)                            the three layouts, alternated, this many times (step times pooled)
#   BANDWIDTH=1gbit LATENCY=0.5ms BURST=128kb  the link's shaping (tc units); LATENCY is one way, on each end
#   PIN=1                                      pin host h to core h mod nproc (taskset), so that one host's idle time
#                                              (a pipeline bubble) is not handed to the other host as on two machines;
#                                              runtime.threads_per_device=THREADS (default 1) either way
#   LOSS_RTOL=1e-4                             the largest relative loss difference allowed between layouts
#   MAX_LOAD= LOAD_WAIT_S=600                  wait (polling every 30 s, at most LOAD_WAIT_S) for the 1-minute load
#                                              average to fall below MAX_LOAD, then measure anyway (empty: no wait)
#   RUN_TIMEOUT_S=600                          kill a layout's hosts after this long
#   KEEP_DIR=path                              keep the runs' logs, metrics and link samples there
#   MESHTRAIN_ARGS="k=v ..."                   extra overrides for every run
# Namespaces (ppb<pid>a/b), the veth pair and every host process started here are removed on exit, whatever happens.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/bench_common.sh
source "$root/bench/bench_common.sh"
build=${1:-$root/build}
[[ -d $build ]] && build=$(cd "$build" && pwd)
meshtrain=$build/meshtrain
model=${MODEL:-llama-10m}
gbs=${GBS:-16}
block=${BLOCK:-$(q 64 128)}
steps=${STEPS:-$(q 4 8)}
warmup=${WARMUP:-$(q 1 2)}
micro=${MICRO:-8}
rounds=${ROUNDS:-$(q 1 2)}
bandwidth=${BANDWIDTH:-1gbit}
latency=${LATENCY:-0.5ms}
burst=${BURST:-128kb}
pin=${PIN:-1}
threads=${THREADS:-1}
loss_rtol=${LOSS_RTOL:-1e-4}
max_load=${MAX_LOAD:-}
load_wait=${LOAD_WAIT_S:-600}
run_timeout=${RUN_TIMEOUT_S:-600}
cores=$(nproc)

die() { echo "pipeline_bench: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "needs root (network namespaces, tc)"
{ command -v ip && command -v tc; } >/dev/null || die "needs ip and tc (iproute2)"
ip netns list >/dev/null 2>&1 || die "\`ip netns list\` fails here"
[[ $pin == 1 ]] && { command -v taskset >/dev/null || die "PIN=1 needs taskset (util-linux); or PIN=0"; }
[[ -x $meshtrain ]] || die "no meshtrain binary at $meshtrain (give the directory holding it as the argument)"
[[ -f $root/configs/model/$model.yaml ]] || die "no model config configs/model/$model.yaml"
(( gbs % 2 == 0 && (gbs / 2) % micro == 0 )) ||
  die "GBS=$gbs: each device of a stage holds GBS/2 rows, which MICRO=$micro micro-batches must divide"
(( steps > warmup )) || die "STEPS=$steps leaves nothing after WARMUP=$warmup"

if [[ -n ${KEEP_DIR:-} ]]; then mkdir -p "$KEEP_DIR"; work=$(cd "$KEEP_DIR" && pwd); else work=$(mktemp -d); fi
tag=$$
ns=("ppb${tag}a" "ppb${tag}b")
veth=("ppv${tag}a" "ppv${tag}b")
subnet=$((tag % 250 + 1))
addr=("198.19.$subnet.1" "198.19.$subnet.2")
pids=()  # every process started here that may still run (host processes lead their own process groups)
secret=$(mktemp /tmp/pipeline_bench.XXXXXX.secret)  # mode 0600

# shellcheck disable=SC2317  # invoked by the trap
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  for n in "${ns[@]}"; do ip netns del "$n" 2>/dev/null || true; done
  ip link del "${veth[0]}" 2>/dev/null || true
  rm -f "$secret"
  [[ -z ${KEEP_DIR:-} ]] && rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$secret"

# The network: two namespaces, a veth pair between them, both ends shaped.
for n in "${ns[@]}"; do ip netns add "$n"; done
ip link add "${veth[0]}" type veth peer name "${veth[1]}"
for h in 0 1; do
  ip link set "${veth[$h]}" netns "${ns[$h]}"
  ip -n "${ns[$h]}" addr add "${addr[$h]}/24" dev "${veth[$h]}"
  ip -n "${ns[$h]}" link set "${veth[$h]}" up
  ip -n "${ns[$h]}" link set lo up
done
shaping=""
for h in 0 1; do
  if err=$(ip netns exec "${ns[$h]}" tc qdisc add dev "${veth[$h]}" root netem delay "$latency" rate "$bandwidth" \
      limit 100000 2>&1); then
    shaping="netem delay $latency rate $bandwidth limit 100000 (on each end)"
  else
    ip netns exec "${ns[$h]}" tc qdisc add dev "${veth[$h]}" root tbf rate "$bandwidth" burst "$burst" latency 100ms
    shaping="tbf rate $bandwidth burst $burst latency 100ms (on each end); latency $latency NOT emulated: netem " \
    shaping+="unavailable (tc: ${err//$'\n'/ })"
  fi
done

# The link as measured: TCP round trip (1-byte ping-pong) and one-way goodput (48 MiB), namespace a -> b.
probe=$(cat <<'EOF'
import socket, sys, time
if sys.argv[1] == "server":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[2], 5999)); s.listen(1)
    print("ready", flush=True)
    c, _ = s.accept()
    for _ in range(400): c.sendall(c.recv(1))
    while c.recv(1 << 20): pass
    c.sendall(b"k")
else:
    for _ in range(100):
        try: c = socket.create_connection((sys.argv[2], 5999)); break
        except OSError: time.sleep(0.05)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtt = []
    for _ in range(400):
        t = time.perf_counter(); c.sendall(b"x"); c.recv(1); rtt.append(time.perf_counter() - t)
    rtt.sort(); buf = bytes(1 << 20); t = time.perf_counter()
    for _ in range(48): c.sendall(buf)
    c.shutdown(socket.SHUT_WR); c.recv(1); dt = time.perf_counter() - t
    print(f"TCP round trip median {rtt[200] * 1e6:.0f} us (min {rtt[0] * 1e6:.0f}), goodput {48 * 8 * 2**20 / dt / 1e9:.2f} Gbit/s")
EOF
)
ip netns exec "${ns[1]}" python3 -c "$probe" server "${addr[1]}" >/dev/null &
pids+=($!)
link_measured=$(ip netns exec "${ns[0]}" python3 -c "$probe" client "${addr[1]}")
wait "${pids[-1]}" || true
unset 'pids[-1]'

wait_for_load_below "$max_load" "$load_wait"

cd "$root"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "pipeline_bench $(date -u '+%Y-%m-%d %H:%M UTC'): $model, global batch $gbs x $block, fp32, 2 hosts x 2 devices" \
  "($threads thread/device$([[ $pin == 1 ]] && echo ", host h pinned to core h")), $steps steps, medians of steps" \
  "$((warmup + 1))..$steps, $rounds round(s), pipeline $micro micro-batches"
echo "commit $(source_commit "$root"); $(cpu_description); $cores cores; binary $meshtrain"
echo "slow link: veth ${veth[0]} (${ns[0]}, ${addr[0]}) <-> ${veth[1]} (${ns[1]}, ${addr[1]}), MTU" \
  "$(ip -n "${ns[0]}" -o link show "${veth[0]}" | sed -n 's/.* mtu \([0-9]*\).*/\1/p'); $shaping"
echo "slow link measured: $link_measured"
echo "load average before: $load_before"

# The three layouts: name|overrides.
layouts=("fsdp over both links|ici_mesh.fsdp=2 dcn_mesh.fsdp=2"
         "data over DCN|ici_mesh.fsdp=2 dcn_mesh.data=2"
         "pipeline over DCN|ici_mesh.fsdp=2 dcn_mesh.pipeline=2 pipeline.schedule=1f1b pipeline.microbatches=$micro")
# shellcheck disable=SC2206
extra=(${MESHTRAIN_ARGS:-})
common=(model="$model" dataset=moby-dick-byte global_batch_size="$gbs" block_size="$block" max_steps="$steps"
        logging_steps=1 compute_dtype=float32 checkpoint.resume=false checkpoint.save_steps=0 metrics.tensorboard=false
        runtime.threads_per_device="$threads")

# The sampler, in host 0's namespace: the veth's byte counters each time metrics.jsonl gains a line (and at start).
sampler=$(cat <<'EOF'
import os, signal, sys, time
dev, metrics, out = sys.argv[1:]
stat = lambda k: int(open(f"/sys/class/net/{dev}/statistics/{k}").read())
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
with open(out, "w", buffering=1) as f:
    last = -1
    while True:
        try:
            lines = sum(1 for l in open(metrics) if '"step_time_s"' in l)
        except OSError:
            lines = 0
        if lines != last:
            f.write(f"{lines} {stat('tx_bytes')} {stat('rx_bytes')} {time.time():.3f}\n")
            last = lines
        time.sleep(0.005)
EOF
)
counters() { ip netns exec "${ns[0]}" cat "/sys/class/net/${veth[0]}/statistics/tx_bytes" \
  "/sys/class/net/${veth[0]}/statistics/rx_bytes" | tr '\n' ' '; }

failed=0
run_layout() {  # $1 run name, then the overrides
  local name=$1 dir=$work/$1 port=$((29400 + RANDOM % 500)); shift
  rm -rf "$dir"; mkdir -p "$dir"
  echo "== $name: $* (load $(load1))" >&2
  load1 >"$dir/load"
  echo "start $(counters)" >"$dir/link"
  ip netns exec "${ns[0]}" python3 -c "$sampler" "${veth[0]}" "$dir/out/metrics.jsonl" "$dir/samples" &
  local sampler_pid=$!
  pids+=("$sampler_pid")
  local host_pids=()
  for h in 0 1; do
    local prefix=(ip netns exec "${ns[$h]}")
    [[ $pin == 1 ]] && prefix+=(taskset -c $((h % cores)))
    setsid "${prefix[@]}" "$meshtrain" train --nnodes 2 --node-rank "$h" --master-addr "${addr[0]}" \
      --master-port "$port" --secret-file "$secret" --devices-per-host 2 "${common[@]}" output_dir="$dir/out" \
      "$@" "${extra[@]}" >"$dir/host$h.log" 2>&1 </dev/null &
    host_pids+=($!)
    pids+=($!)
  done
  local deadline=$((SECONDS + run_timeout)) rc=0
  while kill -0 "${host_pids[0]}" 2>/dev/null || kill -0 "${host_pids[1]}" 2>/dev/null; do
    if (( SECONDS > deadline )); then
      echo "== $name: killed after ${run_timeout}s" >&2
      for pid in "${host_pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    fi
    sleep 0.2
  done
  for h in 0 1; do wait "${host_pids[$h]}" || { rc=$?; echo "host $h exit $rc" >>"$dir/failed"; }; done
  sleep 0.1
  kill -TERM "$sampler_pid" 2>/dev/null || true
  wait "$sampler_pid" 2>/dev/null || true
  echo "end $(counters)" >>"$dir/link"
  pids=()  # everything started for this layout has ended
  if [[ -s $dir/failed ]]; then
    failed=1
    echo "== $name FAILED ($(tr '\n' ' ' <"$dir/failed")); the last lines of each host:" >&2
    for h in 0 1; do tail -n 15 "$dir/host$h.log" | sed "s/^/[host $h] /" >&2; done
  fi
}

for round in $(seq 1 "$rounds"); do
  for layout in "${layouts[@]}"; do
    read -r -a overrides <<<"${layout#*|}"
    run_layout "r$round-$(echo "${layout%%|*}" | tr ' ' '_')" "${overrides[@]}"
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$work" "$rounds" "$steps" "$warmup" "$micro" "$loss_rtol" "$load_before" "$load_after" \
  "${layouts[@]}" <<'PY' || failed=1
import json, os, statistics, sys
work, rounds, steps, warmup, micro, rtol, load_before, load_after = sys.argv[1:9]
layouts = [l.split("|")[0] for l in sys.argv[9:]]
rounds, steps, warmup, micro, rtol = int(rounds), int(steps), int(warmup), int(micro), float(rtol)
devices, hosts, stages = 4, 2, 2
MB = 1e6

def cross_host(name, cb):
    """Device 0's bytes that cross the slow link in one step, from its comm_bytes, and the model used."""
    ag, rs, ar, st = (cb.get(k, 0) for k in ("allgather", "reduce_scatter", "allreduce", "stage_transfer"))
    if name.startswith("fsdp"):   # the fsdp group spans both hosts: gathered and reduce-scattered in two levels
        return ag + rs / 4 + ar, "allgather + reduce_scatter/4 + allreduce"
    if name.startswith("data"):   # fsdp on the host (memory); the data group (one device per host) all-reduces
        return ar, "allreduce"
    return st + ar, "stage_transfer + allreduce"

def load_run(r, name):
    d = os.path.join(work, f"r{r}-{name.replace(' ', '_')}")
    res = {"dir": d, "load": open(os.path.join(d, "load")).read().strip(), "failed": os.path.exists(f"{d}/failed")}
    path = os.path.join(d, "out", "metrics.jsonl")
    rows = [json.loads(l) for l in open(path) if '"step_time_s"' in l] if os.path.exists(path) else []
    rows.sort(key=lambda x: x["step"])
    res["rows"] = rows
    link = dict((l.split()[0], list(map(int, l.split()[1:]))) for l in open(os.path.join(d, "link")))
    res["whole_link"] = sum(link["end"]) - sum(link["start"]) if "end" in link else None
    samples = {}
    if os.path.exists(f"{d}/samples"):
        for l in open(f"{d}/samples"):
            n, tx, rx, t = l.split()
            samples.setdefault(int(n), (int(tx), int(rx)))
    if warmup in samples and len(rows) in samples and len(rows) > warmup:
        a, b = samples[warmup], samples[len(rows)]
        k = len(rows) - warmup
        res["steady"] = ((b[0] - a[0]) / k, (b[1] - a[1]) / k)  # host 0 -> 1, host 1 -> 0, per step
    return res

runs = {name: [load_run(r, name) for r in range(1, rounds + 1)] for name in layouts}
bad = []
for name, rs in runs.items():
    for r, res in enumerate(rs, 1):
        if res["failed"] or len(res["rows"]) != steps:
            bad.append(f"round {r} {name}: failed or incomplete ({len(res['rows'])} of {steps} steps); "
                       f"logs in {res['dir']}")

print(f"\nlosses per step (round 1):")
ref = None
worst = 0.0
for name in layouts:
    for r, res in enumerate(runs[name], 1):
        losses = [x["loss"] for x in res["rows"]]
        if r == 1:
            print(f"  {name:20} " + ", ".join(f"{v:.6f}" for v in losses)
                  + (f"   (grad_norm step 1: {res['rows'][0]['grad_norm']:.4f})" if res["rows"] else ""))
        if len(losses) != steps:
            continue
        if ref is None:
            ref = (name, losses)
            continue
        rel = max(abs(a - b) / abs(b) for a, b in zip(losses, ref[1]))
        worst = max(worst, rel)
        if rel > rtol:
            bad.append(f"round {r} {name}: losses differ from {ref[0]}'s by up to {rel:.2e} relative "
                       f"(LOSS_RTOL {rtol:.0e}): {losses} vs {ref[1]}")
print(f"  largest relative difference between layouts, any step, any round: {worst:.1e} (LOSS_RTOL {rtol:.0e})")

print("\nper layout (steps after the warm-up; device 0's comm_bytes per step, MB):")
table = []
for name in layouts:
    rs = [res for res in runs[name] if len(res["rows"]) == steps]
    if not rs:
        table.append((name, None))
        continue
    kept = [x for res in rs for x in res["rows"][warmup:]]
    times = [x["step_time_s"] for x in kept]
    cb = {k: statistics.median(x["comm_bytes"].get(k, 0) for x in kept) for k in kept[0]["comm_bytes"]}
    derived_dev0, model = cross_host(name, cb)
    derived = devices * derived_dev0  # every device sends the same across: both directions together
    steady = [res["steady"] for res in rs if "steady" in res]
    measured = statistics.median(sum(s) for s in steady) if steady else None
    directions = (statistics.median(s[0] for s in steady), statistics.median(s[1] for s in steady)) if steady else None
    whole = statistics.median(res["whole_link"] / steps for res in rs if res["whole_link"] is not None)
    row = dict(times=times, cb=cb, derived=derived, model=model, measured=measured, directions=directions,
               whole=whole, loads=[res["load"] for res in rs], comm_s=statistics.median(x["comm_s"] for x in kept))
    if "pipeline_bubble_s" in kept[0]:
        row["bubble_fraction"] = statistics.median(x["pipeline_bubble_fraction"] for x in kept)
        row["bubble_s"] = [statistics.median(x["pipeline_bubble_s"][s] for x in kept)
                           for s in range(len(kept[0]["pipeline_bubble_s"]))]
    table.append((name, row))
    print(f"  {name}: load at start {', '.join(row['loads'])}; step times "
          + ", ".join(f"{t:.2f}" for t in times) + f" s; comm_s median {row['comm_s']:.2f} s")
    print("    comm_bytes: " + ", ".join(f"{k} {v / MB:.2f}" for k, v in sorted(cb.items()) if v))
    print(f"    slow link per step: measured on the veth (steps {warmup + 1}..{steps}) "
          + (f"{measured / MB:.1f} MB (host 0 -> 1 {directions[0] / MB:.1f}, 1 -> 0 {directions[1] / MB:.1f})"
             if measured is not None else "-")
          + f"; whole run's counter / {steps} steps {whole / MB:.1f} MB (start-up, control plane, final checkpoint"
          + f" included); from comm_bytes {derived / MB:.1f} MB = {devices} devices x ({model})")

pipe = dict(table).get("pipeline over DCN")
if pipe and "bubble_s" in pipe:
    ideal = (stages - 1) / (micro + stages - 1)
    step = statistics.median(pipe["times"])
    print(f"\n1F1B bubble, {stages} stages x {micro} micro-batches: measured pipeline_bubble_fraction (mean stage wait "
          f"/ step time) {100 * pipe['bubble_fraction']:.1f}%, per-stage waits "
          + ", ".join(f"stage {s} {v:.3f} s" for s, v in enumerate(pipe["bubble_s"]))
          + f"; ideal (S-1)/(M+S-1) = {100 * ideal:.1f}% of the pass (<= {ideal * step:.3f} s of the "
          f"{step:.2f} s median step, which also holds the optimizer and gradient sync)")

fsdp = dict(table).get("fsdp over both links")
fsdp_bytes = fsdp["measured"] if fsdp and fsdp["measured"] else None
w = 22
print(f"\n{'layout':<{w}} | {'step time (s) median [min-max]':<30} | {'slow-link MB/step (veth; comm_bytes)':<37} "
      f"| {'vs fsdp: bytes; time':<20} | bubble")
print("-" * (w + 110))
for name, row in table:
    if row is None:
        print(f"{name:<{w}} | FAILED (see the log above)")
        continue
    t = row["times"]
    ratio = f"{row['measured'] / fsdp_bytes:.3f}" if fsdp_bytes and row["measured"] is not None else "-"
    ratio += f"; {statistics.median(t) / statistics.median(fsdp['times']):.2f}" if fsdp else ""
    bubble = (f"{100 * row['bubble_fraction']:.1f}% (ideal {100 / (micro + 1):.1f}%), stages "
              + " / ".join(f"{v:.2f}" for v in row["bubble_s"]) + " s") if "bubble_s" in row else "-"
    mb = f"{row['measured'] / MB:.1f}" if row["measured"] is not None else "-"
    print(f"{name:<{w}} | {statistics.median(t):7.2f} [{min(t):.2f}-{max(t):.2f}]{'':<12} | "
          f"{mb + ' ; ' + format(row['derived'] / MB, '.1f'):<37} | {ratio:<20} | {bubble}")
print(f"load average before {load_before}, after {load_after}")
if pipe and fsdp_bytes and pipe["measured"] is not None:
    share = pipe["measured"] / fsdp_bytes
    print(f"pipeline's slow-link bytes are {share:.3f} of fsdp's: "
          + ("at most 1/4 (PASS)" if share <= 0.25 else "MORE than 1/4 (FAIL)"))
if bad:
    print("\n".join(["pipeline_bench: FAILED:"] + bad), file=sys.stderr)
    sys.exit(1)
PY
exit "$failed"
