#!/usr/bin/env python3
"""test_openmp_waits.py — a host whose devices run fp32 GEMMs (fp32 compute, or bf16 on the fp32_gemm path) on several
torch threads restarts itself with libgomp's idle threads sleeping (OMP_WAIT_POLICY=PASSIVE,
runtime/compute_threads.hpp), once and only then.

Each case trains llama-tiny for 2 steps on 1 host x 1 device and reads the host's start-up line ("... torch threads
per device (...; OpenMP: <setting>) ..."). The restart must not repeat what the host wrote before it: the resolved
config is printed once. A policy the user set (OMP_WAIT_POLICY or GOMP_SPINCOUNT) is kept as it is.
"""
import os
import re
import subprocess
import tempfile
import unittest

from training_runs import BASE, BINARY

SETTING = re.compile(r"torch threads per device \(.*; OpenMP: (.*)\), coordinator")


def start_up(overrides, extra_env=None):
    """(the host's OpenMP setting as logged, the job's output) of a 2-step run with `overrides`."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(extra_env or {})
    with tempfile.TemporaryDirectory() as out:
        cmd = [BINARY, "run", "--hosts", "1", "--devices-per-host", "1", "--", "train", *BASE, "max_steps=2",
               f"output_dir={out}", *overrides]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    output = result.stdout + result.stderr
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{output[-6000:]}")
    settings = SETTING.findall(output)
    if len(settings) != 1:
        raise AssertionError(f"expected one start-up line with the OpenMP setting, found {settings}:\n{output[-6000:]}")
    return settings[0], output


class OpenMpWaitsTest(unittest.TestCase):
    def test_fp32_with_two_threads_restarts_once_with_passive_waits(self):
        setting, output = start_up(["runtime.threads_per_device=2"])
        self.assertEqual(setting, "OMP_WAIT_POLICY=PASSIVE")
        self.assertEqual(output.count("Resolved config:"), 1, output[-6000:])

    def test_one_thread_keeps_the_default(self):
        setting, _ = start_up(["runtime.threads_per_device=1"])
        self.assertEqual(setting, "idle threads spin (libgomp's default)")

    def test_native_bf16_keeps_the_default(self):
        setting, _ = start_up(["runtime.threads_per_device=2", "compute_dtype=bfloat16", "bf16_matmul=native"])
        self.assertEqual(setting, "idle threads spin (libgomp's default)")

    def test_bf16_on_fp32_gemms_restarts_once_with_passive_waits(self):
        # Its GEMMs run in OpenBLAS, as fp32's do; the start-up line that says so is printed once.
        setting, output = start_up(["runtime.threads_per_device=2", "compute_dtype=bfloat16", "bf16_matmul=fp32_gemm"])
        self.assertEqual(setting, "OMP_WAIT_POLICY=PASSIVE")
        self.assertEqual(output.count("Resolved config:"), 1, output[-6000:])
        self.assertEqual(output.count("bf16 matmuls: fp32 GEMMs of bf16 values"), 1, output[-6000:])

    def test_the_users_setting_is_kept(self):
        setting, _ = start_up(["runtime.threads_per_device=2"], {"GOMP_SPINCOUNT": "1000"})
        self.assertEqual(setting, "GOMP_SPINCOUNT=1000")


if __name__ == "__main__":
    unittest.main()
