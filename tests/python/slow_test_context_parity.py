#!/usr/bin/env python3
"""slow_test_context_parity.py — context parallelism gives the single-device losses (issue 36: long context).

The data: 600 short documents (20 to 140 bytes, byte tokens) prepared into shards, so that most rows of 64 tokens hold
the end of one document and the start of the next (with the corpus' long chapters the mask would change nothing).
One device trains llama-tiny for 10 steps (fp32, same seed and data), documents kept apart and not; then each layout
runs as 2 real host processes over loopback with each row's 64 tokens split over `context` (each device holding two
chunks, an early and a late one): context=2 over DCN; context=4 (ici x dcn); ici context=2 x dcn fsdp=2; dcn context=2
x ici fsdp=2; dcn context=2 x ici tensor=2. Each step's loss and grad norm must equal the single device's up to
floating-point reordering (1e-4 relative; a chunk in the wrong place, a missing K/V gradient or a position off by one
are off by 1e-2 or more from the first step), and both hosts must print the same loss. Then a checkpoint saved at step
5 on context=4 resumes on one device and continues the same losses, and the K/V exchange is counted on its own
(`comm_bytes.kv_exchange`, `kv_exchange_s`).
"""
import json
import os
import random
import shutil
import subprocess
import tempfile
import unittest

from training_runs import BINARY, read_records, train as train_on

STEPS, SAVE = 10, 5
TOLERANCE = 1e-4

LAYOUTS = {
    "dcn context=2": (2, 1, ["ici_mesh.fsdp=1", "dcn_mesh.context=2"]),
    "context=4": (2, 2, ["ici_mesh.fsdp=1", "ici_mesh.context=2", "dcn_mesh.context=2"]),
    "ici context=2 x dcn fsdp=2": (2, 2, ["ici_mesh.fsdp=1", "ici_mesh.context=2", "dcn_mesh.fsdp=2"]),
    "dcn context=2 x ici fsdp=2": (2, 2, ["ici_mesh.fsdp=2", "dcn_mesh.context=2"]),
    "dcn context=2 x ici tensor=2": (2, 2, ["ici_mesh.fsdp=1", "ici_mesh.tensor=2", "dcn_mesh.context=2"]),
}


def prepare_short_documents(folder):
    """Shards of 600 short documents of words drawn with a fixed seed; returns their path."""
    words = "the whale sea ship captain harpoon white deep storm sailor ocean wind rope boat".split()
    rng = random.Random(7)
    corpus = os.path.join(folder, "short.jsonl")
    with open(corpus, "w") as f:
        for _ in range(600):
            text = ""
            target = rng.randint(20, 140)
            while len(text) < target:
                text += rng.choice(words) + " "
            f.write(json.dumps({"text": text.strip() + "."}) + "\n")
    shards = os.path.join(folder, "shards")
    subprocess.run([BINARY, "prepare", "--tokenizer", "byte", "--output", shards, "--no-progress", corpus],
                   check=True, capture_output=True)
    return shards


def train(output_dir, hosts, devices, overrides, **kwargs):
    """training_runs.train on the short documents."""
    return train_on(output_dir, hosts, devices, [f"dataset.path={ContextParityTest.shards}", *overrides], **kwargs)


class ContextParityTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.shards = prepare_short_documents(cls.tmp.name)
        cls.reference = {}
        for documents in ("false", "true"):
            out = os.path.join(cls.tmp.name, f"one_{documents}")
            train(out, 1, 1, [f"max_steps={STEPS}", "ici_mesh.fsdp=1", f"data.document_mask={documents}"])
            cls.reference[documents] = read_records(out)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check_layout(self, name, documents, extra=()):
        hosts, devices, overrides = LAYOUTS[name]
        out = os.path.join(self.tmp.name, f"{name}_{documents}".replace(" ", "_").replace("=", ""))
        _, per_host, output = train(out, hosts, devices, [f"max_steps={STEPS}", f"data.document_mask={documents}",
                                                          *overrides, *extra])
        got, want = read_records(out), self.reference[documents]
        self.assertEqual(sorted(got), sorted(want), name)
        for step, record in want.items():
            for key in ("loss", "grad_norm"):
                self.assertAlmostEqual(got[step][key], record[key], delta=TOLERANCE * abs(record[key]),
                                       msg=f"{name}, documents {documents}: {key} at step {step}")
        self.assertEqual(sorted(per_host), list(range(hosts)), f"{name}: every host logs its loss\n{output[-3000:]}")
        for host in range(1, hosts):
            self.assertEqual(per_host[host], per_host[0], f"{name}: host {host} printed other losses than host 0")
        return out, got, output

    def test_documents_change_the_losses(self):
        # Otherwise the runs with documents prove nothing about keeping them apart.
        self.assertNotAlmostEqual(self.reference["true"][1]["loss"], self.reference["false"][1]["loss"], places=4)

    def test_dcn_context2(self):
        for documents in ("false", "true"):
            _, got, output = self.check_layout("dcn context=2", documents)
            self.assertIn("i32[8@(data,fsdp), 64@context]", output)
            for record in got.values():
                self.assertGreater(record["comm_bytes"]["kv_exchange"], 0)
                self.assertGreaterEqual(record["kv_exchange_s"], 0)

    def test_context4(self):
        for documents in ("false", "true"):
            self.check_layout("context=4", documents)

    def test_ici_context2_dcn_fsdp2(self):
        self.check_layout("ici context=2 x dcn fsdp=2", "true", ["activation_checkpointing=full"])

    def test_dcn_context2_ici_fsdp2(self):
        self.check_layout("dcn context=2 x ici fsdp=2", "true", ["gradient_accumulation_steps=2"])

    def test_dcn_context2_ici_tensor2(self):
        for documents in ("false", "true"):
            self.check_layout("dcn context=2 x ici tensor=2", documents)

    def test_checkpoint_from_context4_resumes_on_one_device(self):
        saving = ["ici_mesh.fsdp=1", "ici_mesh.context=2", "dcn_mesh.context=2", f"max_steps={STEPS}",
                  f"checkpoint.save_steps={SAVE}", "data.document_mask=true"]
        full_dir = os.path.join(self.tmp.name, "saving")
        full, _, _ = train(full_dir, 2, 2, saving)
        out = os.path.join(self.tmp.name, "resumed")
        step_dir = f"step-{SAVE:06d}"
        shutil.copytree(os.path.join(full_dir, "checkpoints", step_dir), os.path.join(out, "checkpoints", step_dir))
        losses, _, output = train(out, 1, 1, [f"max_steps={STEPS}", "ici_mesh.fsdp=1", "data.document_mask=true"])
        self.assertIn("Resuming from", output)
        self.assertEqual(sorted(losses), list(range(SAVE + 1, STEPS + 1)))
        for step, loss in losses.items():
            self.assertAlmostEqual(loss, full[step], delta=TOLERANCE * abs(full[step]), msg=f"step {step}")

    def test_bad_block_size_is_refused(self):
        _, _, output = train(os.path.join(self.tmp.name, "bad"), 1, 2, ["ici_mesh.fsdp=1", "ici_mesh.context=2",
                                                                          "block_size=66"], expect_failure=True)
        self.assertIn("block_size=66", output)


if __name__ == "__main__":
    unittest.main(verbosity=2)
