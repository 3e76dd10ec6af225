#!/usr/bin/env python3
"""test_bf16_matmul.py — compute_dtype=bfloat16 both ways of running its matmuls (bf16_matmul, model/compute_matmul.hpp).

llama-tiny trains 20 steps on 1 host x 1 device in fp32, then in bf16 with bf16_matmul=native (libtorch's bf16 GEMM)
and bf16_matmul=fp32_gemm (fp32 GEMMs of the bf16 values): every step's loss of each bf16 run is within bf16's
tolerance (2%, as the bf16 checks of llama_test.cpp and slow_test_parallel_parity.py) of the fp32 run's. The host
says once at start-up which path runs and why; with auto, the CPU's flags and the probe's rates, and the path follows
them (native needs a bf16 flag and a bf16 product at least as fast as fp32's); on fp32_gemm the MFU denominator is
the fp32 GEMM's peak. A wrong value is refused, naming the key.
"""
import os
import re
import tempfile
import unittest

from training_runs import train

AUTO_LINE = re.compile(r"bf16 matmuls: (libtorch's bf16 GEMMs|fp32 GEMMs of bf16 values) \(this CPU has [^;]+; "
                       r"probe \[256 x 256\] x \[256 x 256\]: bf16 ([0-9.]+) GFLOP/s vs fp32 ([0-9.]+); "
                       r"bf16_matmul=(native|fp32_gemm) forces the other path\)")


class Bf16MatmulTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def run_job(self, name, overrides, **kwargs):
        return train(os.path.join(self.tmp.name, name), 1, 1, overrides, **kwargs)

    def test_both_paths_train_within_bf16_tolerance_of_fp32(self):
        fp32, _, output = self.run_job("fp32", ["max_steps=20"])
        self.assertEqual(sorted(fp32), list(range(1, 21)))
        self.assertNotIn("bf16 matmuls:", output)
        for path, says in (("native", "libtorch's bf16 GEMMs"), ("fp32_gemm", "fp32 GEMMs of bf16 values")):
            with self.subTest(path=path):
                # fp32_gemm measures its MFU denominator (metrics.peak_gflops=0): the fp32 GEMM's, the one that runs.
                extra = ["metrics.peak_gflops=0"] if path == "fp32_gemm" else []
                bf16, _, output = self.run_job(path, ["max_steps=20", "compute_dtype=bfloat16",
                                                      f"bf16_matmul={path}", *extra])
                self.assertEqual(output.count("bf16 matmuls:"), 1, output[-6000:])
                self.assertIn(f"bf16 matmuls: {says} (bf16_matmul={path}; this CPU has ", output)
                if extra:  # the fp32 figure: theoretical from the fp32 FMA units, or measured with fp32 GEMMs
                    denominator = re.search(r"MFU denominator: [0-9.]+ GFLOP/s per device, (theoretical|measured)"
                                            r"[^\n]*", output)
                    self.assertIsNotNone(denominator, output[-6000:])
                    self.assertNotIn("bf16", denominator.group(0).split("; CPU")[0])
                self.assertEqual(sorted(bf16), list(range(1, 21)))
                for step in range(1, 21):
                    self.assertAlmostEqual(bf16[step], fp32[step], delta=2e-2 * fp32[step], msg=f"step {step}")

    def test_auto_says_which_path_runs_and_why(self):
        _, _, output = self.run_job("auto", ["max_steps=2", "compute_dtype=bfloat16"])
        lines = AUTO_LINE.findall(output)
        self.assertEqual(len(lines), 1, output[-6000:])
        says, bf16_rate, fp32_rate, other = lines[0]
        flags = "has no avx512_bf16/amx_bf16" not in output  # native needs a bf16 flag and the probe's word
        native = flags and float(bf16_rate) >= float(fp32_rate)
        self.assertEqual(says, "libtorch's bf16 GEMMs" if native else "fp32 GEMMs of bf16 values")
        self.assertEqual(other, "fp32_gemm" if native else "native")

    def test_a_wrong_value_names_the_key_and_the_values(self):
        _, _, output = self.run_job("bad", ["bf16_matmul=fast"], expect_failure=True)
        self.assertIn("bf16_matmul=fast: expected auto", output)
        self.assertIn("native", output)
        self.assertIn("fp32_gemm", output)


if __name__ == "__main__":
    unittest.main()
