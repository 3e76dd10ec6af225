#!/usr/bin/env python3
"""slow_test_moe.py — a Mixtral trains the same on every expert layout as on one device (issue: mixture of experts).

One device trains mixtral-tiny (4 experts, top-2) for 12 steps (fp32, dropless); then each expert layout runs as 2
real host processes over loopback: ici expert=2 x fsdp=2; dcn expert=2 x ici fsdp=2; expert=2 x data=2; expert=2 x
tensor=2. Each step's loss (the language-model cross entropy), aux_loss (the load-balancing loss) and expert load
must equal the single-device ones up to floating-point reordering (2e-4 relative per step, as for the dense layouts:
a missing all-to-all, a wrong gradient scale or a token sent to the wrong expert is off by 1e-2 or more), and every
host must print the same loss. A checkpoint written on expert=2 x fsdp=2 resumes on expert=4 and on one device
and continues the single-device run. Dropping with a capacity factor reports the dropped fraction.
"""
import json
import os
import shutil
import tempfile
import unittest

from training_runs import read_records, train

STEPS = 12
MOE = ["model=mixtral-tiny"]
LAYOUTS = {
    "ici expert=2 x fsdp=2": (2, 2, ["ici_mesh.expert=2", "ici_mesh.fsdp=2", "dcn_mesh.fsdp=1"]),
    "dcn expert=2 x ici fsdp=2": (2, 2, ["dcn_mesh.expert=2", "ici_mesh.fsdp=2", "dcn_mesh.fsdp=1"]),
    "expert=2 x data=2": (2, 2, ["ici_mesh.expert=2", "ici_mesh.fsdp=1", "dcn_mesh.data=2", "dcn_mesh.fsdp=1"]),
    "expert=2 x tensor=2": (2, 2, ["ici_mesh.expert=2", "ici_mesh.fsdp=1", "dcn_mesh.tensor=2", "dcn_mesh.fsdp=1"]),
}


class MixtureOfExpertsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        out = os.path.join(cls.tmp.name, "one")
        cls.reference, _, cls.reference_output = train(out, 1, 1, [*MOE, f"max_steps={STEPS}", "ici_mesh.fsdp=1"])
        cls.reference_records = read_records(out)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def assert_same_run(self, name, got, want, steps):
        for step in steps:
            g, w = got[step], want[step]
            self.assertAlmostEqual(g["loss"], w["loss"], delta=2e-4 * w["loss"], msg=f"{name}: loss at step {step}")
            self.assertAlmostEqual(g["aux_loss"], w["aux_loss"], delta=2e-4 * w["aux_loss"],
                                   msg=f"{name}: aux_loss at step {step}")
            self.assertEqual(g["expert_load"], w["expert_load"], f"{name}: expert load at step {step}")

    def test_reference_trains_and_reports_the_routing(self):
        self.assertEqual(sorted(self.reference), list(range(1, STEPS + 1)))
        self.assertLess(self.reference[STEPS], self.reference[1] - 1.0)
        self.assertIn("Training a Mixtral of 2 layers x 64 hidden", self.reference_output)
        for r in self.reference_records.values():
            # 8 x 64 tokens, 2 experts each, 2 layers: every slot is routed to one of the 4 experts.
            self.assertEqual(len(r["expert_load"]), 4)
            self.assertEqual(sum(r["expert_load"]), 8 * 64 * 2 * 2)
            self.assertAlmostEqual(r["expert_load_max_over_mean"], max(r["expert_load"]) / (2048 / 4), places=9)
            self.assertEqual(r["dropped_fraction"], 0.0)
            # HF's aux_loss, E * sum f_e P_e with sum f = k: k = 2 when perfectly balanced (f_e = k/E, P_e = 1/E),
            # about E = 4 when two experts take every token.
            self.assertGreater(r["aux_loss"], 1.9)
            self.assertLess(r["aux_loss"], 4.0)
            self.assertEqual(r["comm_bytes"]["alltoall"], 0)

    def check_layout(self, name):
        hosts, devices, overrides = LAYOUTS[name]
        out = os.path.join(self.tmp.name, name.replace(" ", "_").replace("=", ""))
        _, per_host, output = train(out, hosts, devices, [*MOE, f"max_steps={STEPS}", *overrides])
        got = read_records(out)
        self.assertEqual(sorted(got), list(range(1, STEPS + 1)))
        self.assert_same_run(name, got, self.reference_records, range(1, STEPS + 1))
        self.assertEqual(sorted(per_host), list(range(hosts)), f"{name}: every host logs its loss\n{output[-3000:]}")
        for host in range(1, hosts):
            self.assertEqual(per_host[host], per_host[0], f"{name}: host {host} printed other losses than host 0")
        # The rows travel to their experts by all-to-all; each device holds 2 of the 4 experts of each layer, and
        # reads only its own rows, split over expert too.
        self.assertTrue(all(r["comm_bytes"]["alltoall"] > 0 for r in got.values()), name)
        self.assertIn("expert=2: 2 of the 4 experts of each layer", output)
        self.assertIn("rows over (data,fsdp,expert)", output)
        return got

    def test_ici_expert2_fsdp2(self):
        self.check_layout("ici expert=2 x fsdp=2")

    def test_dcn_expert2_ici_fsdp2(self):
        self.check_layout("dcn expert=2 x ici fsdp=2")

    def test_expert2_data2(self):
        self.check_layout("expert=2 x data=2")

    def test_expert2_tensor2(self):
        self.check_layout("expert=2 x tensor=2")

    def test_checkpoint_resumes_on_other_expert_layouts(self):
        # Saved at step 6 on expert=2 x fsdp=2 (Hugging Face Mixtral names), resumed on expert=4 and on one device.
        first = os.path.join(self.tmp.name, "ckpt")
        train(first, 2, 2, [*MOE, f"max_steps={STEPS}", "checkpoint.save_steps=6", *LAYOUTS["ici expert=2 x fsdp=2"][2]])
        step6 = os.path.join(first, "checkpoints", "step-000006")
        with open(os.path.join(step6, "model.safetensors.index.json")) as f:
            names = set(json.load(f)["weight_map"])
        for layer in range(2):
            self.assertIn(f"model.layers.{layer}.block_sparse_moe.gate.weight", names)
            for e in range(4):
                for w in ("w1", "w2", "w3"):
                    self.assertIn(f"model.layers.{layer}.block_sparse_moe.experts.{e}.{w}.weight", names)
        self.assertFalse(any(".mlp." in n for n in names))
        with open(os.path.join(step6, "config.json")) as f:
            config = json.load(f)
        self.assertEqual((config["model_type"], config["architectures"], config["num_local_experts"],
                          config["num_experts_per_tok"], config["router_aux_loss_coef"]),
                         ("mixtral", ["MixtralForCausalLM"], 4, 2, 0.02))
        for name, hosts, devices, mesh in (("expert4", 1, 4, ["ici_mesh.expert=4", "ici_mesh.fsdp=1"]),
                                           ("one", 1, 1, ["ici_mesh.fsdp=1"])):
            out = os.path.join(self.tmp.name, f"resume_{name}")
            os.makedirs(os.path.join(out, "checkpoints"))
            shutil.copytree(step6, os.path.join(out, "checkpoints", "step-000006"))
            _, _, output = train(out, hosts, devices, [*MOE, f"max_steps={STEPS}", *mesh])
            self.assertIn("Resuming from", output)
            self.assert_same_run(f"resumed on {name}", read_records(out), self.reference_records, range(7, STEPS + 1))

    def test_capacity_factor_drops_and_reports(self):
        out = os.path.join(self.tmp.name, "capacity")
        _, _, output = train(out, 1, 2, [*MOE, "max_steps=3", "ici_mesh.expert=2", "ici_mesh.fsdp=1",
                                         "moe.capacity_factor=0.75"])
        for r in read_records(out).values():
            self.assertGreater(r["dropped_fraction"], 0.1)
            self.assertLess(r["dropped_fraction"], 0.5)
        self.assertIn("dropped: ", output)

    def test_layout_errors_name_the_reason(self):
        _, _, output = train(os.path.join(self.tmp.name, "dense"), 1, 2, ["ici_mesh.expert=2", "ici_mesh.fsdp=1"],
                             expect_failure=True)
        self.assertIn("a dense Llama has no experts to place", output)
        _, _, output = train(os.path.join(self.tmp.name, "three"), 1, 3, [*MOE, "ici_mesh.expert=3", "ici_mesh.fsdp=1",
                                                                          "global_batch_size=6"], expect_failure=True)
        self.assertIn("num_local_experts (4) to be a multiple of 3", output)
        _, _, output = train(os.path.join(self.tmp.name, "negative"), 1, 1, [*MOE, "moe.capacity_factor=-1"],
                             expect_failure=True)
        self.assertIn("moe.capacity_factor must be 0 (dropless) or positive, got -1", output)


if __name__ == "__main__":
    unittest.main(verbosity=2)
