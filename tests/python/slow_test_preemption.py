#!/usr/bin/env python3
"""slow_test_preemption.py — a job stopped by its scheduler saves and ends cleanly, and resumes where it stopped.

SIGTERM to one host of two (as a TPU or cloud scheduler sends it): both hosts finish the same step K, save it, print
`preempted at step K; saved <dir>` and exit 0 within the bound; resuming from that checkpoint on the same mesh gives
the uninterrupted run's losses, bitwise. Through `meshtrain run --hosts 2`, SIGTERM to the launcher is passed on to
its hosts the same way, and the launcher exits 0.
"""
import os
import re
import signal
import subprocess
import tempfile
import time
import unittest

from host_processes import start_job, stop_job, wait_job
from training_runs import BASE, BINARY, read_losses

STEPS = 12
TRAIN = ["ici_mesh.fsdp=2", "dcn_mesh.fsdp=2", "global_batch_size=4", "block_size=32", f"max_steps={STEPS}",
         "checkpoint.save_steps=100", "runtime.failure_timeout_s=4", "runtime.heartbeat_interval_s=0.5"]
BOUND_S = 20  # a step, a checkpoint of llama-tiny and the exit, on a loaded 2-core machine
PREEMPTED = re.compile(r"preempted at step (\d+); saved (\S+)")


def run_to_end(out, overrides):
    hosts = start_job([out, out], 2, [*TRAIN, *overrides])
    try:
        wait_job(hosts, 300)
    finally:
        stop_job(hosts)
    return hosts


class PreemptionTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="meshtrain-preempt-")

    def test_sigterm_to_one_host_saves_on_every_host_and_resumes_bitwise(self):
        straight_dir = os.path.join(self.tmp, "straight")
        for h in run_to_end(straight_dir, ["checkpoint.resume=false"]):
            self.assertEqual(h.exit_code, 0, h.output[-3000:])
        straight = read_losses(straight_dir)

        out = os.path.join(self.tmp, "preempted")
        hosts = start_job([out, out], 2, [*TRAIN, "checkpoint.resume=false"])
        signalled = []

        def on_poll():
            if not signalled and hosts[0].first_time("step: 4/") is not None:
                os.kill(hosts[1].process.pid, signal.SIGTERM)
                signalled.append(time.monotonic())

        try:
            wait_job(hosts, 300, on_poll=on_poll)
        finally:
            stop_job(hosts)
        self.assertTrue(signalled, hosts[0].output[-3000:])
        steps = set()
        for h in hosts:
            self.assertEqual(h.exit_code, 0, f"host {h.host}\n{h.output[-4000:]}")
            self.assertLess(h.exit_time - signalled[0], BOUND_S, f"host {h.host} took too long to stop")
            m = PREEMPTED.search(h.output)
            self.assertIsNotNone(m, f"host {h.host}\n{h.output[-3000:]}")
            steps.add(int(m.group(1)))
            self.assertTrue(os.path.exists(os.path.join(m.group(2), "meshtrain_complete.json")), m.group(2))
        self.assertEqual(len(steps), 1, f"the hosts stopped after different steps: {steps}")
        stopped = steps.pop()
        self.assertLess(stopped, STEPS)

        resumed = run_to_end(out, [])
        for h in resumed:
            self.assertEqual(h.exit_code, 0, h.output[-3000:])
            self.assertIn(f"step-{stopped:06d}", h.output)
        losses = read_losses(out)
        self.assertEqual(sorted(losses), list(range(1, STEPS + 1)))
        for step in range(1, STEPS + 1):
            self.assertEqual(losses[step], straight[step], f"step {step}")

    def test_sigterm_to_the_launcher_is_passed_on(self):
        out = os.path.join(self.tmp, "launcher")
        cmd = [BINARY, "run", "--hosts", "2", "--devices-per-host", "1", "--", "train", *BASE, f"output_dir={out}",
               "ici_mesh.fsdp=1", "dcn_mesh.fsdp=2", "global_batch_size=4", "block_size=32", "max_steps=200",
               "checkpoint.resume=false"]
        launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = []
        for line in launcher.stdout:
            lines.append(line)
            if "step: 3/" in line:
                launcher.send_signal(signal.SIGTERM)
                break
        lines.extend(launcher.stdout)
        self.assertEqual(launcher.wait(timeout=120), 0, "".join(lines[-60:]))
        output = "".join(lines)
        self.assertEqual(len(PREEMPTED.findall(output)), 2, output[-3000:])


if __name__ == "__main__":
    unittest.main()
