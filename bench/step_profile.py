#!/usr/bin/env python3
"""step_profile.py — the top operators by self time per training step, from Chrome traces of libtorch's profiler.

    bench/step_profile.py TRACE.json [TRACE.json ...] --steps N [--top 12]

Reads the traces model_step_bench --trace-dir writes (meshtrain.json from the C++ profiler, pytorch.json from the
peer's torch.autograd.profiler) and prints, per trace, the operators with the most self time: an event's duration
less that of the events nested in it on the same thread, summed by name and divided by the steps profiled.
"""
import argparse
import collections
import json


def self_times(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    by_thread = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            by_thread[(e.get("pid"), e.get("tid"))].append((float(e["ts"]), float(e["dur"]), e["name"]))
    totals = collections.Counter()
    for spans in by_thread.values():
        spans.sort(key=lambda s: (s[0], -s[1]))  # parents before the children that start with them
        stack = []  # [end, name, self] of the open events
        for start, duration, name in spans:
            while stack and stack[-1][0] <= start:
                end, open_name, own = stack.pop()
                totals[open_name] += own
            if stack:
                stack[-1][2] -= duration
            stack.append([start + duration, name, duration])
        for end, name, own in stack:
            totals[name] += own
    return totals


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--steps", type=int, required=True, help="steps the traces hold")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    for path in args.traces:
        totals = self_times(path)
        step_ms = sum(totals.values()) / 1e3 / args.steps
        print(f"{path}: {step_ms:.0f} ms of operators per step (profiled)")
        for name, us in totals.most_common(args.top):
            print(f"  {us / 1e3 / args.steps:9.1f} ms  {100 * us / sum(totals.values()):5.1f}%  {name}")


if __name__ == "__main__":
    main()
