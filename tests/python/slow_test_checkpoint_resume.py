#!/usr/bin/env python3
"""slow_test_checkpoint_resume.py — mesh checkpoints: resume, resharding, export, and refusals, with real processes.

A run on fsdp=4 (2 hosts x 2 devices) trains 10 steps and saves at steps 5 and 10. Its step-5 checkpoint is then
copied into fresh output folders and resumed:
  * on the same mesh: steps 6..10 have exactly the losses of the uninterrupted run (bitwise);
  * on data=2 x fsdp=2 (dcn data, 2 hosts) and on one device: the same losses up to floating-point reordering
    (the checkpoint is resharded on load, the data cursor continues with the same global batches);
  * with the learning rate changed: refused, naming the key;
  * with a damaged weight file: refused, naming the file;
  * with the newest checkpoint incomplete (no completion marker): that one is skipped with a warning.
The step-10 checkpoint is a Hugging Face directory: `meshtrain score` loads it on one device, and its index maps every
parameter to a file that exists.

InterruptedSaveTest (issue 34): a save on 1 host x 2 devices dies before its marker; the run resumes on 1 device,
saves that step again and is killed at the next step; the next resume must load that step (the interrupted save's
files are never read beside the later ones). A save that hits a full disk (a file size limit, EFBIG, stands in for
ENOSPC: the same failed write) removes its partial folder, exits 1 and leaves the older checkpoint to resume from.
"""
import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import unittest

from training_runs import BASE, BINARY, train

STEPS, SAVE = 10, 5
MESH = ["ici_mesh.fsdp=4", f"max_steps={STEPS}", f"checkpoint.save_steps={SAVE}", "checkpoint.keep=3"]


class CheckpointResumeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.full_dir = os.path.join(cls.tmp.name, "full")
        cls.full, _, _ = train(cls.full_dir, 2, 2, MESH)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def checkpoint(self, step):
        return os.path.join(self.full_dir, "checkpoints", f"step-{step:06d}")

    def resumed_dir(self, name, step=SAVE):
        """A fresh output folder holding only the full run's checkpoint of `step`."""
        out = os.path.join(self.tmp.name, name)
        shutil.copytree(self.checkpoint(step), os.path.join(out, "checkpoints", f"step-{step:06d}"))
        return out

    def test_saved_steps_are_complete(self):
        for step in (SAVE, STEPS):
            self.assertTrue(os.path.exists(os.path.join(self.checkpoint(step), "meshtrain_complete.json")))

    def test_resume_on_the_same_mesh_is_bitwise(self):
        losses, _, output = train(self.resumed_dir("same"), 2, 2, MESH)
        self.assertIn("Resuming from", output)
        self.assertEqual(sorted(losses), list(range(SAVE + 1, STEPS + 1)))
        for step in losses:
            self.assertEqual(losses[step], self.full[step], f"step {step}")

    def check_close(self, losses):
        self.assertEqual(sorted(losses), list(range(SAVE + 1, STEPS + 1)))
        for step in losses:
            self.assertAlmostEqual(losses[step], self.full[step], delta=2e-4 * abs(self.full[step]), msg=f"step {step}")

    def test_resume_resharded_on_data_x_fsdp(self):
        overrides = [m for m in MESH if not m.startswith("ici_mesh")] + ["dcn_mesh.data=2", "ici_mesh.fsdp=2"]
        losses, _, _ = train(self.resumed_dir("reshard"), 2, 2, overrides)
        self.check_close(losses)

    def test_resume_on_one_device(self):
        overrides = [m for m in MESH if not m.startswith("ici_mesh")] + ["ici_mesh.fsdp=1"]
        losses, _, _ = train(self.resumed_dir("single"), 1, 1, overrides)
        self.check_close(losses)

    def test_changed_learning_rate_is_refused(self):
        _, _, output = train(self.resumed_dir("changed"), 1, 1, ["max_steps=10", "optimizer.learning_rate=0.01"],
                             expect_failure=True)
        self.assertIn("optimizer.learning_rate", output)

    def test_damaged_weights_are_refused(self):
        out = self.resumed_dir("damaged")
        weights = os.path.join(out, "checkpoints", f"step-{SAVE:06d}", "model-00001-of-00004.safetensors")
        with open(weights, "r+b") as f:
            f.seek(-5, os.SEEK_END)
            byte = f.read(1)[0]
            f.seek(-5, os.SEEK_END)
            f.write(bytes([byte ^ 0xFF]))
        _, _, output = train(out, 2, 2, MESH, expect_failure=True)
        self.assertIn("model-00001-of-00004.safetensors", output)

    def test_incomplete_newest_checkpoint_is_skipped_with_a_warning(self):
        out = self.resumed_dir("incomplete")
        newer = os.path.join(out, "checkpoints", f"step-{STEPS:06d}")
        shutil.copytree(self.checkpoint(STEPS), newer)
        os.remove(os.path.join(newer, "meshtrain_complete.json"))
        losses, _, output = train(out, 2, 2, MESH)
        # The warning names the skipped folder (the resumed run later writes a folder of that name itself, so the
        # name alone would prove nothing), and the run resumes from the older, complete one.
        self.assertRegex(output, rf"checkpoint \S*step-{STEPS:06d} is incomplete \(no meshtrain_complete.json: the run "
                                 r"stopped while saving it\); skipping it")
        self.assertRegex(output, rf"Resuming from \S*step-{SAVE:06d} \(step {SAVE},")
        self.assertEqual(min(losses), SAVE + 1)

    def test_export_is_a_hugging_face_directory(self):
        ckpt = self.checkpoint(STEPS)
        with open(os.path.join(ckpt, "model.safetensors.index.json")) as f:
            index = json.load(f)
        with open(os.path.join(ckpt, "config.json")) as f:
            config = json.load(f)
        self.assertEqual(config["hidden_size"], 64)
        self.assertIn("model.embed_tokens.weight", index["weight_map"])
        self.assertIn("lm_head.weight", index["weight_map"])
        for file in set(index["weight_map"].values()):
            self.assertTrue(os.path.exists(os.path.join(ckpt, file)), file)
        result = subprocess.run([BINARY, "score", "--checkpoint", ckpt, "--tokenizer", "byte", "--text", "Call me Ishmael.",
                                 "--json"],
                                capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stderr)
        scored = json.loads(result.stdout)
        self.assertLess(scored["loss"], 5.5)  # ln(256) = 5.55 for a model that learned nothing


class InterruptedSaveTest(unittest.TestCase):
    COMMON = ["max_steps=6", "checkpoint.save_steps=2", "checkpoint.keep=5"]

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.run_dir = os.path.join(self.tmp.name, "run")
        self.checkpoints = os.path.join(self.run_dir, "checkpoints")

    def tearDown(self):
        self.tmp.cleanup()

    def test_a_save_interrupted_on_another_mesh_never_spoils_a_later_resume(self):
        _, _, output = train(self.run_dir, 1, 2, [*self.COMMON, "ici_mesh.fsdp=2", "debug.fault=kill_in_save",
                                                  "debug.fault_step=4", "debug.fault_device=1"], expect_failure=True)
        self.assertEqual(sorted(os.listdir(self.checkpoints)), ["step-000002", "step-000004.partial"], output[-3000:])

        # On 1 device: resumes from step 2, saves step 4 again (the partial folder is replaced), dies at step 5.
        _, _, output = train(self.run_dir, 1, 1, [*self.COMMON, "ici_mesh.fsdp=1", "debug.fault=kill",
                                                  "debug.fault_step=5", "debug.fault_device=0"], expect_failure=True)
        self.assertRegex(output, r"checkpoint save \S*step-000004.partial was interrupted")
        self.assertRegex(output, r"Resuming from \S*step-000002 \(step 2,")
        self.assertEqual(sorted(os.listdir(self.checkpoints)), ["step-000002", "step-000004"], output[-3000:])
        step4 = os.path.join(self.checkpoints, "step-000004")
        self.assertEqual(sorted(f for f in os.listdir(step4) if f.startswith("optimizer-")),
                         ["optimizer-00001-of-00001.safetensors"])

        losses, _, output = train(self.run_dir, 1, 1, [*self.COMMON, "ici_mesh.fsdp=1"])
        self.assertRegex(output, r"Resuming from \S*step-000004 \(step 4,")
        self.assertEqual(max(losses), 6)

    def test_a_full_disk_during_a_save_keeps_the_older_checkpoint(self):
        run = ["max_steps=4", "checkpoint.save_steps=2"]
        train(self.run_dir, 1, 1, [*run, "debug.fault=kill", "debug.fault_step=3"], expect_failure=True)
        limit = 128 << 10  # above every small file of a run, below llama-tiny's weights (500 KB)

        def limit_file_size():
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead

        cmd = [BINARY, "run", "--hosts", "1", "--devices-per-host", "1", "--", "train", *BASE,
               f"output_dir={self.run_dir}", *run]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size)
        output = result.stdout + result.stderr
        self.assertEqual(result.returncode, 1, output[-3000:])
        self.assertRegex(output, r"saving checkpoint \S*step-000004 failed: writing \S* failed")
        self.assertEqual(os.listdir(self.checkpoints), ["step-000002"])

        losses, _, output = train(self.run_dir, 1, 1, run)
        self.assertRegex(output, r"Resuming from \S*step-000002 \(step 2,")
        self.assertEqual(sorted(losses), [1, 2, 3, 4])
        self.assertEqual(sorted(os.listdir(self.checkpoints)), ["step-000002", "step-000004"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
