#!/usr/bin/env python3
"""slow_test_pipeline_parity.py — pipeline parallelism gives the single-device losses (issue 37: pipeline).

One device trains llama-tiny with 4 decoder layers (model.num_hidden_layers=4) for 10 steps (fp32, same seed and
data); then each layout runs as real host processes over loopback with the layers split into stages over `pipeline`:
pipeline=2 over DCN with GPipe and with 1F1B, pipeline=4 (ici x dcn), pipeline over DCN with fsdp=2 inside each stage
(with gradient accumulation and activation checkpointing), pipeline over DCN with tensor=2 inside, and the interleaved
1F1B over 2 virtual stages per rank with fsdp=2 inside. Each step's loss and
grad norm must equal the single device's up to floating-point reordering (1e-4 relative: a gradient not sent back or
sent to the wrong micro-batch is off by far more from the first step), every host must print the same loss, and the
activations are counted on their own (`comm_bytes.stage_transfer`) with each stage's bubble in metrics.jsonl. A
checkpoint saved at step 5 on pipeline=2 resumes on one device and on fsdp=4 and continues the same losses; a device
that throws inside a stage ends every host with the reason; `meshtrain plan` prints the stages and the schedule's
timeline; layouts that do not fit are refused naming the key.
"""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from training_runs import BINARY, read_records, train

STEPS, SAVE = 10, 5
TOLERANCE = 1e-4
MODEL = ["model.num_hidden_layers=4"]

LAYOUTS = {
    "dcn pipeline=2 gpipe": (2, 1, ["ici_mesh.fsdp=1", "dcn_mesh.pipeline=2", "pipeline.schedule=gpipe"]),
    "dcn pipeline=2 1f1b": (2, 1, ["ici_mesh.fsdp=1", "dcn_mesh.pipeline=2", "pipeline.schedule=1f1b",
                                   "pipeline.microbatches=4"]),
    "pipeline=4": (2, 2, ["ici_mesh.fsdp=1", "ici_mesh.pipeline=2", "dcn_mesh.pipeline=2"]),
    "dcn pipeline=2 x ici fsdp=2": (2, 2, ["ici_mesh.fsdp=2", "dcn_mesh.pipeline=2", "gradient_accumulation_steps=2",
                                           "activation_checkpointing=full", "pipeline.microbatches=2"]),
    "dcn pipeline=2 x ici tensor=2": (2, 2, ["ici_mesh.fsdp=1", "ici_mesh.tensor=2", "dcn_mesh.pipeline=2"]),
    "dcn pipeline=2 interleaved x ici fsdp=2": (2, 2, ["ici_mesh.fsdp=2", "dcn_mesh.pipeline=2",
                                                       "pipeline.virtual_stages=2", "pipeline.microbatches=4"]),
}


class PipelineParityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        out = os.path.join(cls.tmp.name, "one")
        train(out, 1, 1, [*MODEL, f"max_steps={STEPS}", "ici_mesh.fsdp=1"])
        cls.reference = read_records(out)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check_layout(self, name):
        hosts, devices, overrides = LAYOUTS[name]
        out = os.path.join(self.tmp.name, name.replace(" ", "_").replace("=", ""))
        _, per_host, output = train(out, hosts, devices, [*MODEL, f"max_steps={STEPS}", *overrides])
        got = read_records(out)
        self.assertEqual(sorted(got), sorted(self.reference), name)
        for step, record in self.reference.items():
            for key in ("loss", "grad_norm"):
                self.assertAlmostEqual(got[step][key], record[key], delta=TOLERANCE * abs(record[key]),
                                       msg=f"{name}: {key} at step {step}")
        self.assertEqual(sorted(per_host), list(range(hosts)), f"{name}: every host logs its loss\n{output[-3000:]}")
        for host in range(1, hosts):
            self.assertEqual(per_host[host], per_host[0], f"{name}: host {host} printed other losses than host 0")
        stages = 4 if name == "pipeline=4" else 2
        for record in got.values():
            # Device 0 is on the first stage: it sends activations forward every micro-batch.
            self.assertGreater(record["comm_bytes"]["stage_transfer"], 0, name)
            self.assertEqual(len(record["pipeline_bubble_s"]), stages, name)
            self.assertTrue(0 <= record["pipeline_bubble_fraction"] < 1, name)
        self.assertIn("Pipeline schedule: stage 0 |", output)
        return output

    def test_dcn_pipeline2_gpipe(self):
        output = self.check_layout("dcn pipeline=2 gpipe")
        self.assertIn("stage 0: embedding, layers 0-1; stage 1: layers 2-3, final norm, head and loss", output)

    def test_dcn_pipeline2_1f1b(self):
        self.check_layout("dcn pipeline=2 1f1b")

    def test_pipeline4(self):
        self.check_layout("pipeline=4")

    def test_dcn_pipeline2_ici_fsdp2_accumulation_checkpointing(self):
        self.check_layout("dcn pipeline=2 x ici fsdp=2")

    def test_dcn_pipeline2_ici_tensor2(self):
        self.check_layout("dcn pipeline=2 x ici tensor=2")

    def test_dcn_pipeline2_interleaved_ici_fsdp2(self):
        output = self.check_layout("dcn pipeline=2 interleaved x ici fsdp=2")
        self.assertIn("Pipeline: 4 stages on 2 ranks (2 virtual stages each)", output)

    def test_checkpoint_from_pipeline2_resumes_on_one_device_and_on_fsdp4(self):
        saving = [*MODEL, "ici_mesh.fsdp=1", "dcn_mesh.pipeline=2", f"max_steps={STEPS}",
                  f"checkpoint.save_steps={SAVE}"]
        full_dir = os.path.join(self.tmp.name, "saving")
        full, _, _ = train(full_dir, 2, 1, saving)
        step_dir = f"step-{SAVE:06d}"
        for name, hosts, devices, layout in (("one", 1, 1, ["ici_mesh.fsdp=1"]),
                                             ("fsdp4", 2, 2, ["ici_mesh.fsdp=2", "dcn_mesh.fsdp=2"])):
            out = os.path.join(self.tmp.name, f"resumed_{name}")
            shutil.copytree(os.path.join(full_dir, "checkpoints", step_dir),
                            os.path.join(out, "checkpoints", step_dir))
            losses, _, output = train(out, hosts, devices, [*MODEL, f"max_steps={STEPS}", *layout])
            self.assertIn("Resuming from", output)
            self.assertEqual(sorted(losses), list(range(SAVE + 1, STEPS + 1)), name)
            for step, loss in losses.items():
                self.assertAlmostEqual(loss, full[step], delta=TOLERANCE * abs(full[step]), msg=f"{name} step {step}")

    def test_a_device_that_throws_inside_a_stage_ends_every_host(self):
        # Device 1 is the second stage: the first waits for its gradients when it fails.
        _, _, output = train(os.path.join(self.tmp.name, "throws"), 2, 1,
                             [*MODEL, "ici_mesh.fsdp=1", "dcn_mesh.pipeline=2", f"max_steps={STEPS}",
                              "debug.fault=throw", "debug.fault_step=3", "debug.fault_device=1"],
                             expect_failure=True)
        self.assertIn("fault injected at step 3", output)
        self.assertIn("[host 0]", output)
        host0 = [line for line in output.splitlines() if line.startswith("[host 0]") and "ERROR" in line]
        self.assertTrue(any("fault injected at step 3" in line for line in host0), "\n".join(host0[-20:]))

    def test_plan_shows_the_stages_and_the_timeline(self):
        args = [BINARY, "plan", "--hosts", "2", "--devices-per-host", "2", "model=llama-tiny", *MODEL,
                "ici_mesh.fsdp=2", "dcn_mesh.pipeline=2", "pipeline.microbatches=2"]
        text = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True).stdout
        self.assertIn("Pipeline: 2 stages (stage 0: embedding, layers 0-1; stage 1: layers 2-3, final norm, head and "
                      "loss); schedule 1f1b, each pass of 4 rows per device in 2 micro-batches of 2 rows", text)
        self.assertIn("Pipeline schedule: stage 0 | F0 F1 .. .. B0 B0 .. B1 B1", text)
        self.assertIn("Pipeline schedule: stage 1 | .. F0 B0 B0 F1 B1 B1 .. ..", text)
        plan = json.loads(subprocess.run([*args, "--json"], capture_output=True, text=True, timeout=60,
                                         check=True).stdout)
        self.assertEqual(len(plan["pipeline"]), 4, plan["pipeline"])

    def test_layouts_that_do_not_fit_are_refused_naming_the_key(self):
        _, _, output = train(os.path.join(self.tmp.name, "stages"), 1, 4, ["ici_mesh.fsdp=1", "ici_mesh.pipeline=4"],
                             expect_failure=True)
        self.assertIn("pipeline=4 splits the model into 4 stages, but it has 2 decoder layers", output)
        self.assertIn("use pipeline=2 at most", output)
        _, _, output = train(os.path.join(self.tmp.name, "micro"), 1, 2,
                             [*MODEL, "ici_mesh.fsdp=1", "ici_mesh.pipeline=2", "pipeline.microbatches=3"],
                             expect_failure=True)
        self.assertIn("pipeline.microbatches=3 does not divide the 8 rows", output)
        self.assertIn("use one of 1, 2, 4, 8", output)
        _, _, output = train(os.path.join(self.tmp.name, "split"), 1, 2,
                             [*MODEL, "ici_mesh.fsdp=1", "ici_mesh.pipeline=2", "pipeline.layers_per_stage=1,2"],
                             expect_failure=True)
        self.assertIn("pipeline.layers_per_stage gives 2 stages with 3 layers", output)


if __name__ == "__main__":
    unittest.main(verbosity=2)
