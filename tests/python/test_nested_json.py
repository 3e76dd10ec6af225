#!/usr/bin/env python3
"""test_nested_json.py — no JSON that meshtrain reads can crash it (issue 34): every reader of untrusted JSON given a
value nested 100,000 levels deep ends its command with exit 2 and a message naming the file (and, where the file is
not skipped line by line, the depth limit), where it segfaulted before (exit 139: nlohmann's recursive dump
overflowed the stack while the error message was built).

Readers reached through the CLI: a checkpoint's config.json, completion marker, index, safetensors header and
training_state.json (`score`), a token-shard index.json (`plan`), tokenizer.json (`tokenize`), a line of prepare's
JSONL input (`prepare`) and metrics.jsonl (`plot`). Each damaged checkpoint file is listed in the marker with its new
size and checksum, so that the reader meets it rather than the checksum.
"""
import json
import os
import shutil
import struct
import subprocess
import tempfile
import unittest

from training_runs import BINARY, train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NESTED = "[" * 100000 + "]" * 100000
LIMIT = "nested deeper than the limit of 64 levels of objects and arrays"


def crc32c_table():
    table = []
    for n in range(256):
        for _ in range(8):
            n = (n >> 1) ^ (0x82F63B78 if n & 1 else 0)
        table.append(n)
    return table


CRC32C_TABLE = crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = (crc >> 8) ^ CRC32C_TABLE[(crc ^ byte) & 0xFF]
    return crc ^ 0xFFFFFFFF


class NestedJsonTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.run_dir = os.path.join(cls.tmp.name, "run")
        train(cls.run_dir, 1, 1, ["max_steps=1"])
        cls.checkpoint = os.path.join(cls.run_dir, "checkpoints", "step-000001")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def assert_refused(self, path, args, message=LIMIT):
        result = subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=120)
        output = result.stdout + result.stderr
        self.assertEqual(result.returncode, 2, output[-3000:])
        self.assertIn(f"{path}: {message}", output)

    def checkpoint_with(self, name, data):
        """A copy of the run's checkpoint whose file `name` holds `data`; returns (copy, the file's path)."""
        copy = os.path.join(self.tmp.name, f"checkpoint-{name}")
        shutil.copytree(self.checkpoint, copy)
        data = data.encode() if isinstance(data, str) else data
        with open(os.path.join(copy, name), "wb") as f:
            f.write(data)
        marker_path = os.path.join(copy, "meshtrain_complete.json")
        if name != "meshtrain_complete.json":
            with open(marker_path) as f:
                marker = json.load(f)
            for entry in marker["files"]:
                if entry["name"] == name:
                    entry.update(bytes=len(data), crc32c=crc32c(data))
            with open(marker_path, "w") as f:
                json.dump(marker, f)
        return copy, os.path.join(copy, name)

    def test_checkpoint_files(self):
        header = '{"lm_head.weight": {"dtype": "F32", "shape": ' + NESTED + ', "data_offsets": [0, 0]}}'
        header += " " * (-len(header) % 8)
        cases = {
            "config.json": '{"model_type": "llama", "hidden_size": ' + NESTED + "}",
            "meshtrain_complete.json": '{"files": [' + NESTED + "]}",
            "model.safetensors.index.json": '{"weight_map": {"lm_head.weight": ' + NESTED + "}}",
            "model-00001-of-00001.safetensors": struct.pack("<Q", len(header)) + header.encode(),
            "training_state.json": '{"format": "meshtrain-training-state", "version": 1, "step": ' + NESTED + "}",
        }
        for name, data in cases.items():
            with self.subTest(name):
                copy, path = self.checkpoint_with(name, data)
                # Without --tokenizer, score reads the tokenizer's name from training_state.json.
                tokenizer = [] if name == "training_state.json" else ["--tokenizer", "byte"]
                self.assert_refused(path, ["score", "--checkpoint", copy, *tokenizer, "--text", "Call me Ishmael."])

    def test_token_shard_index(self):
        shards = os.path.join(self.tmp.name, "shards")
        shutil.copytree(os.path.join(ROOT, "assets", "shards", "moby-dick-byte"), shards)
        index = os.path.join(shards, "index.json")
        with open(index, "w") as f:
            f.write('{"format": "meshtrain-token-shards", "sources": ' + NESTED + "}")
        self.assert_refused(index, ["plan", f"dataset.path={shards}"])

    def test_tokenizer_json(self):
        path = os.path.join(self.tmp.name, "tokenizer", "tokenizer.json")
        os.makedirs(os.path.dirname(path))
        with open(path, "w") as f:
            f.write('{"model": {"type": "BPE"}, "pre_tokenizer": ' + NESTED + "}")
        self.assert_refused(path, ["tokenize", "--tokenizer", path, "hello"])

    def test_a_jsonl_line_for_prepare(self):
        path = os.path.join(self.tmp.name, "docs.jsonl")
        with open(path, "w") as f:
            f.write('{"text": "Call me Ishmael."}\n{"text": ' + NESTED + "}\n")
        self.assert_refused(f"{path}:2", ["prepare", "--tokenizer", "byte", "--output",
                                          os.path.join(self.tmp.name, "prepared"), path])

    def test_metrics_jsonl_for_plot(self):
        run = os.path.join(self.tmp.name, "plotted")
        os.makedirs(run)
        shutil.copy(os.path.join(self.run_dir, "metrics.jsonl"), run)
        metrics = os.path.join(run, "metrics.jsonl")
        with open(metrics) as f:
            lines = len(f.readlines())
        with open(metrics, "a") as f:
            f.write('{"step": ' + NESTED + "}\n")
        self.assert_refused(f"{metrics}:{lines + 1}", ["plot", run], message="not a metrics line")


if __name__ == "__main__":
    unittest.main(verbosity=2)
