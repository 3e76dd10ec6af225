"""training_runs.py — starts real `meshtrain run ... -- train` jobs for the Python tests and reads what they wrote.

Every job runs llama-tiny on the embedded corpus in byte tokens (dataset moby-dick-byte), fp32, one torch thread per
device, into its own output_dir; `train(...)` returns the losses per step from <output_dir>/metrics.jsonl and the
loss each host printed in its log lines (so a test can check that every host reports the same global loss).
"""
import json
import os
import re
import subprocess

BINARY = os.environ.get("MESHTRAIN_BINARY", "")

BASE = ["model=llama-tiny", "dataset=moby-dick-byte", "global_batch_size=8", "block_size=64", "logging_steps=1",
        "runtime.threads_per_device=1", "metrics.peak_gflops=100", "lr_scheduler.warmup_steps=3"]


def train(output_dir, hosts, devices_per_host, overrides, timeout=300, expect_failure=False):
    """Runs one job; returns (losses by step from metrics.jsonl, {host: {step: loss text}} from the logs, output)."""
    cmd = [BINARY, "run", "--hosts", str(hosts), "--devices-per-host", str(devices_per_host), "--", "train",
           *BASE, f"output_dir={output_dir}", *overrides]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    output = result.stdout + result.stderr
    if expect_failure:
        if result.returncode == 0:
            raise AssertionError(f"expected {' '.join(cmd)} to fail:\n{output[-4000:]}")
        return None, None, output
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{output[-6000:]}")
    return read_losses(output_dir), host_losses(output), output


def read_records(output_dir):
    """{step: its metrics.jsonl record} of the training lines (not the evaluations')."""
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        return {r["step"]: r for r in map(json.loads, f) if "loss" in r}


def read_losses(output_dir):
    losses = {}
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if "loss" in record:  # not an evaluation's line
                losses[record["step"]] = record["loss"]
    return losses


LOG_LOSS = re.compile(r"^\[host (\d+)\].*\bstep[:= ]+(\d+)\b.*\bloss[^0-9]*([0-9.]+(?:e[-+]?\d+)?)")


def host_losses(output):
    """{host: {step: loss as printed}} from the launcher's prefixed log lines."""
    per_host = {}
    for line in output.splitlines():
        m = LOG_LOSS.match(line)
        if m:
            per_host.setdefault(int(m.group(1)), {})[int(m.group(2))] = m.group(3)
    return per_host
