#!/usr/bin/env python3
"""slow_test_parallel_parity.py — every parallel layout gives the single-device losses (issue: SPMD parallelism).

One device trains llama-tiny for 20 steps (fp32, same seed and data); then each layout runs as 2 real host processes
talking over loopback: fsdp=4; data=2 fsdp=2; fsdp=2 tensor=2; dcn data=2 x ici fsdp=2; ici fsdp=4 x dcn fsdp=2
(8 devices). Each step's loss must equal the single-device loss up to floating-point reordering, and both hosts must
print the same loss. The tolerance (2e-4 relative per step over 20 AdamW steps) is far below what a wrong scale,
a dropped shard or a missing reduction gives (those are off from the first step by 1e-2 or more).
"""
import json
import os
import re
import tempfile
import unittest

from training_runs import train

STEPS = 20
# llama-tiny's shapes (configs/model/llama-tiny.yaml) and the tokens per device at fsdp=4 (training_runs.BASE: global
# batch 8 x block 64).
TINY_VOCAB, TINY_HIDDEN = 256, 64
TOKENS_PER_DEVICE_AT_FSDP4 = 8 * 64 // 4


def lookup_bytes(hidden):
    """Device 0's payload per step of the embedding lookup by rows at fsdp=4: (reduce-scatter, all-gather) bytes.

    Forward: the group's token ids all-gathered (int64) and the rows [4 N, D] reduce-scattered (fp32); backward: the
    token ids and the gradient rows [N, D] (fp32) all-gathered."""
    n = TOKENS_PER_DEVICE_AT_FSDP4
    return 4 * n * hidden * 4, 2 * n * 8 + n * hidden * 4


LAYOUTS = {
    "fsdp=4": (2, 2, ["ici_mesh.fsdp=4"]),
    "data=2 fsdp=2": (2, 2, ["ici_mesh.data=2", "ici_mesh.fsdp=2"]),
    "fsdp=2 tensor=2": (2, 2, ["ici_mesh.fsdp=2", "ici_mesh.tensor=2"]),
    "dcn data=2 x ici fsdp=2": (2, 2, ["dcn_mesh.data=2", "ici_mesh.fsdp=2"]),
    "ici fsdp=4 x dcn fsdp=2": (2, 4, ["ici_mesh.fsdp=4", "dcn_mesh.fsdp=2"]),
}


class ParallelParityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.reference, _, _ = train(os.path.join(cls.tmp.name, "one"), 1, 1, [f"max_steps={STEPS}", "ici_mesh.fsdp=1"])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_reference_loss_goes_down(self):
        self.assertEqual(sorted(self.reference), list(range(1, STEPS + 1)))
        self.assertLess(self.reference[STEPS], self.reference[1] - 1.0)

    def check_layout(self, name):
        hosts, devices, overrides = LAYOUTS[name]
        out = os.path.join(self.tmp.name, name.replace(" ", "_").replace("=", ""))
        losses, per_host, output = train(out, hosts, devices, [f"max_steps={STEPS}", *overrides])
        self.assertEqual(sorted(losses), sorted(self.reference), name)
        for step, want in self.reference.items():
            self.assertAlmostEqual(losses[step], want, delta=2e-4 * abs(want), msg=f"{name}: step {step}")
        self.assertEqual(sorted(per_host), list(range(hosts)), f"{name}: every host logs its loss\n{output[-3000:]}")
        for host in range(1, hosts):
            self.assertEqual(per_host[host], per_host[0], f"{name}: host {host} printed other losses than host 0")
        return out, output

    def test_fsdp4(self):
        out, output = self.check_layout("fsdp=4")
        # metrics.jsonl's comm_bytes: device 0's payload per collective kind in the step. With fsdp=4 and resharding,
        # each unit's gradient but the embedding's (the whole unit, padded to a multiple of 4) is reduce-scattered
        # once (llama-tiny's head is not tied to the embedding), and each device all-gathers its quarter of the head
        # once and of every layer twice (forward, and again for backward). The embedding goes by rows of each shard
        # (ParallelModel::rows_by_shard): a reduce-scatter of the group's looked-up rows, and all-gathers of the token
        # ids (forward and backward) and of the gradient rows.
        layers, hidden, params = map(int, re.search(
            r"Training a Llama of (\d+) layers x (\d+) hidden \((\d+) parameters\)", output).groups())
        units = layers + 2  # the embedding, each layer, the head
        table = TINY_VOCAB * hidden
        lookup_reduce, lookup_gather = lookup_bytes(hidden)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            records = [json.loads(line) for line in f]
        for r in records:
            sent = r["comm_bytes"]
            self.assertEqual(sorted(sent),
                             ["allgather", "allreduce", "alltoall", "broadcast", "kv_exchange", "reduce_scatter",
                              "stage_transfer"])
            self.assertTrue(4 * (params - table) <= sent["reduce_scatter"] - lookup_reduce
                            <= 4 * (params - table + 3 * units), (r["step"], sent, params))
            self.assertTrue(params - table < sent["allgather"] - lookup_gather <= 2 * (params + 3 * units),
                            (r["step"], sent, params))
            self.assertTrue(0 < sent["allreduce"] < 1024, (r["step"], sent))
            self.assertEqual(sent["alltoall"] + sent["broadcast"] + sent["kv_exchange"] + sent["stage_transfer"], 0,
                             (r["step"], sent))

    def test_bf16_compute_gathers_half_the_bytes(self):
        # compute_dtype=bfloat16: FSDP all-gathers carry bf16 (the weights are rounded to bf16 for the matmuls
        # anyway), so the same layout moves half the all-gather bytes of fp32, and the same reduce-scatter bytes
        # (gradients stay fp32); the losses follow one bf16 device (reduction order only).
        runs = {}
        for dtype, hosts, devices, mesh in (("float32", 2, 2, "ici_mesh.fsdp=4"), ("bfloat16", 2, 2, "ici_mesh.fsdp=4"),
                                            ("bfloat16", 1, 1, "ici_mesh.fsdp=1")):
            out = os.path.join(self.tmp.name, f"gather_{dtype}_{hosts * devices}")
            losses, _, _ = train(out, hosts, devices, ["max_steps=3", mesh, f"compute_dtype={dtype}"])
            with open(os.path.join(out, "metrics.jsonl")) as f:
                runs[(dtype, hosts * devices)] = (losses, [json.loads(line)["comm_bytes"] for line in f])
        fp32, bf16 = runs[("float32", 4)][1], runs[("bfloat16", 4)][1]
        # The embedding lookup's all-gathers (token ids, fp32 gradient rows) are the same bytes in both.
        _, lookup_gather = lookup_bytes(TINY_HIDDEN)
        for step in range(3):
            self.assertGreater(fp32[step]["allgather"], lookup_gather)
            self.assertEqual(2 * (bf16[step]["allgather"] - lookup_gather), fp32[step]["allgather"] - lookup_gather,
                             step)
            self.assertEqual(bf16[step]["reduce_scatter"], fp32[step]["reduce_scatter"], step)
        one, mesh = runs[("bfloat16", 1)][0], runs[("bfloat16", 4)][0]
        for step in range(1, 4):
            self.assertAlmostEqual(mesh[step], one[step], delta=2e-2 * abs(one[step]), msg=f"step {step}")

    def test_activation_checkpointing_changes_no_bit_of_the_losses(self):
        # Recomputing a layer's forward in backward gives the same activations, so the same gradients: every loss
        # of every step equal, bitwise, with full and every_2 checkpointing (fsdp=2 x tensor=2: the regather and
        # the tensor-parallel all-reduces happen again in the recompute).
        runs = {}
        for mode in ("none", "full", "every_2"):
            out = os.path.join(self.tmp.name, f"ac_{mode}")
            runs[mode], _, _ = train(out, 2, 2, ["max_steps=5", "ici_mesh.fsdp=2", "ici_mesh.tensor=2",
                                                 f"activation_checkpointing={mode}"])
        self.assertEqual(sorted(runs["none"]), list(range(1, 6)))
        self.assertEqual(runs["full"], runs["none"])
        self.assertEqual(runs["every_2"], runs["none"])
        _, _, output = train(os.path.join(self.tmp.name, "ac_bad"), 1, 1, ["activation_checkpointing=every_0"],
                             expect_failure=True)
        self.assertIn("activation_checkpointing=every_0: expected none, full or every_<k>", output)

    def test_data2_fsdp2(self):
        self.check_layout("data=2 fsdp=2")

    def test_fsdp2_tensor2(self):
        self.check_layout("fsdp=2 tensor=2")

    def test_dcn_data2_ici_fsdp2(self):
        self.check_layout("dcn data=2 x ici fsdp=2")

    def test_ici_fsdp4_dcn_fsdp2(self):
        self.check_layout("ici fsdp=4 x dcn fsdp=2")


if __name__ == "__main__":
    unittest.main(verbosity=2)
