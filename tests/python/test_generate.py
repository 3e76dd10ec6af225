#!/usr/bin/env python3
"""test_generate.py — `meshtrain generate` on a checkpoint a real 2-host job wrote, against an independent greedy decode.

llama-tiny trains 6 steps as 2 host processes x 2 devices (ici fsdp=2 x dcn fsdp=2: the checkpoint is written by
several devices into several safetensors files). The reference here reads those files itself and decodes greedily
in float64 with test_model_reference.py's model, recomputing the whole sequence for every new token (no cache);
meshtrain decodes in fp32 with its KV cache. The new tokens must be the same; where the reference's two best logits
are within 1e-4 (a tie that fp32 rounding may break either way) the C++ choice must be one of them. With --prompt the
byte tokenizer comes from the checkpoint's training_state.json. Sampling is reproducible with a seed and top-k 1 is
greedy.
"""
import glob
import json
import os
import subprocess
import tempfile
import unittest

import torch

from test_model_reference import check_greedy_tokens, read_safetensors
from training_runs import BINARY, train

NEW_TOKENS = 16


def generate(checkpoint, *args):
    cmd = [BINARY, "generate", "--checkpoint", checkpoint, "--json", "--threads", "1", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return json.loads(result.stdout)


class GenerateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        out = os.path.join(cls.tmp.name, "run")
        train(out, 2, 2, ["max_steps=6", "ici_mesh.fsdp=2", "dcn_mesh.fsdp=2", "metrics.tensorboard=false"])
        cls.checkpoint = os.path.join(out, "checkpoints", "step-000006")
        cls.output_dir = out
        files = glob.glob(os.path.join(cls.checkpoint, "model*.safetensors"))
        cls.params = {}
        for f in files:
            cls.params.update({k: v.to(torch.float64) for k, v in read_safetensors(f).items()})
        with open(os.path.join(cls.checkpoint, "config.json")) as f:
            cls.cfg = json.load(f)
        cls.cfg.setdefault("head_dim", cls.cfg["hidden_size"] // cls.cfg["num_attention_heads"])
        cls.files = files

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_checkpoint_has_several_files(self):
        self.assertGreater(len(self.files), 1, "the job's devices wrote one file: the test would not cover shards")

    def test_greedy_tokens_equal_the_reference(self):
        prompt = [67, 97, 108, 108, 32, 109, 101]  # "Call me"
        got = generate(self.checkpoint, "--tokens", " ".join(map(str, prompt)), "--max-new-tokens", str(NEW_TOKENS))
        self.assertEqual(len(got["tokens"]), NEW_TOKENS)
        check_greedy_tokens(self, self.cfg, self.params, prompt, got["tokens"])
        # The checkpoint names its data's tokenizer (byte), so the text is there too.
        self.assertEqual(got["text"], bytes(got["tokens"]).decode("utf-8", errors="replace"))

    def test_prompt_text_uses_the_checkpoints_tokenizer(self):
        by_text = generate(self.checkpoint, "--prompt", "Call me", "--max-new-tokens", "8")
        # A run's output_dir names its newest checkpoint.
        by_ids = generate(self.output_dir, "--tokens", "67 97 108 108 32 109 101", "--max-new-tokens", "8")
        self.assertEqual(by_text, by_ids)

    def test_sampling_is_reproducible_with_a_seed(self):
        args = ["--tokens", "84 104 101", "--max-new-tokens", "24", "--temperature", "1.0"]
        first = generate(self.checkpoint, *args, "--seed", "3")
        self.assertEqual(generate(self.checkpoint, *args, "--seed", "3"), first)
        self.assertNotEqual(generate(self.checkpoint, *args, "--seed", "4")["tokens"], first["tokens"])
        greedy = generate(self.checkpoint, "--tokens", "84 104 101", "--max-new-tokens", "24")
        self.assertEqual(generate(self.checkpoint, *args, "--seed", "3", "--top-k", "1"), greedy)

    def test_documents_kept_apart_continue_the_last_one_alone(self):
        # Two prompts are documents packed one after the other: without the key the continuation sees both; with
        # data.document_mask=true it sees only the last, exactly as that document alone.
        first, last = "83 116 117 98 98", "67 97 108 108 32 109 101"
        alone = generate(self.checkpoint, "--tokens", last, "--max-new-tokens", "16")
        kept_apart = generate(self.checkpoint, "--tokens", first, "--tokens", last, "--max-new-tokens", "16",
                              "data.document_mask=true")
        packed = generate(self.checkpoint, "--tokens", first, "--tokens", last, "--max-new-tokens", "16")
        self.assertEqual(kept_apart, alone)
        self.assertEqual(packed, generate(self.checkpoint, "--tokens", f"{first} {last}", "--max-new-tokens", "16"))

    def test_scored_documents_kept_apart_equal_each_document_alone(self):
        def score(*args):
            cmd = [BINARY, "score", "--checkpoint", self.checkpoint, "--json", "--threads", "1", *args]
            return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60).stdout)
        first, last = "83 116 117 98 98 32 119", "67 97 108 108 32 109 101 32 73"
        alone = [score("--tokens", doc)["logprobs"] for doc in (first, last)]
        kept_apart = score("--tokens", first, "--tokens", last, "data.document_mask=true")["logprobs"]
        packed = score("--tokens", first, "--tokens", last)["logprobs"]
        n = len(first.split())
        # logprobs[i] predicts token i + 1: the first document's, then the second's first token (from the end of the
        # first), then the rest of the second, which with the mask see only their own document.
        for got, want in zip(kept_apart[:n - 1] + kept_apart[n:], alone[0] + alone[1]):
            self.assertAlmostEqual(got, want, places=4)
        self.assertEqual(len(kept_apart), len(packed))
        self.assertGreater(max(abs(a - b) for a, b in zip(kept_apart[n:], packed[n:])), 1e-3)
        result = subprocess.run([BINARY, "score", "--checkpoint", self.checkpoint, "--tokens", "1 2",
                                 "data.document_mask=maybe"], capture_output=True, text=True, timeout=60)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("data.document_mask=maybe: expected true or false", result.stderr)

    def test_bad_options_name_the_option(self):
        result = subprocess.run([BINARY, "generate", "--checkpoint", self.checkpoint, "--tokens", "1 x"],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 2)
        self.assertIn("--tokens: 'x' is not a token id", result.stderr)
        result = subprocess.run([BINARY, "generate", "--checkpoint", self.checkpoint, "--tokens", "1",
                                 "--top-p", "0"], capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 2)
        self.assertIn("--top-p must be in (0, 1]", result.stderr)


if __name__ == "__main__":
    unittest.main()
