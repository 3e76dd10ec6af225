#!/usr/bin/env python3
"""test_lying_shard.py — a token shard whose ids exceed the vocabulary, with every checksum recomputed and its
index's max_token left small, as a careless converter or an attacker would write it.

Before issue 34 the trainer accepted it: one device ended in torch's `index out of range in self` naming no file, and
with few bad ids a run could finish with exit 0. Now the loader checks each id where it widens it: the job ends on
both hosts with exit 2 and a message naming the shard, the sample and the id.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

from training_runs import BASE, BINARY

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz"))
from make_corpus import crc32c  # noqa: E402 (the shard format's checksum, as the fuzz seeds compute it)

TEXT = ("Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, "
        "and nothing particular to interest me on shore, I thought I would sail about a little.\n") * 40


def plant_id(shard_dir, position, token_id):
    """Writes `token_id` at token `position` of the first shard, with its payload and header checksums and the
    index's checksum recomputed (docs/formats.md); the index's max_token is left as it was."""
    path = os.path.join(shard_dir, "shard_00000.tok")
    with open(path, "rb") as f:
        shard = bytearray(f.read())
    token_bytes, tokens_offset, file_bytes = struct.unpack_from("<I", shard, 16)[0], \
        struct.unpack_from("<Q", shard, 40)[0], struct.unpack_from("<Q", shard, 56)[0]
    struct.pack_into("<H" if token_bytes == 2 else "<I", shard, tokens_offset + position * token_bytes, token_id)
    payload = crc32c(bytes(shard[256:file_bytes]))
    struct.pack_into("<I", shard, 64, payload)
    struct.pack_into("<I", shard, 252, crc32c(bytes(shard[:252])))
    with open(path, "wb") as f:
        f.write(shard)
    index_path = os.path.join(shard_dir, "index.json")
    with open(index_path) as f:
        index = json.load(f)
    index["shards"][0]["crc32c"] = f"{payload:08x}"
    with open(index_path, "w") as f:
        json.dump(index, f)
    return index["shards"][0]["max_token"]


class LyingShardTest(unittest.TestCase):
    def test_an_id_beyond_the_vocabulary_ends_the_job_naming_the_shard(self):
        with tempfile.TemporaryDirectory() as tmp:
            text = os.path.join(tmp, "story.txt")
            with open(text, "w") as f:
                f.write(TEXT)
            shards = os.path.join(tmp, "shards")
            subprocess.run([BINARY, "prepare", "--tokenizer", "byte", "--output", shards, "--no-progress", text],
                           check=True, capture_output=True)
            self.assertLess(plant_id(shards, 1000, 300), 256)
            result = subprocess.run(
                [BINARY, "run", "--hosts", "2", "--devices-per-host", "1", "--", "train", *BASE,
                 f"output_dir={os.path.join(tmp, 'run')}", f"dataset.path={shards}", "block_size=32",
                 "global_batch_size=4", "max_steps=80", "dcn_mesh.fsdp=2", "ici_mesh.fsdp=1",
                 "checkpoint.resume=false", "eval.every_steps=0"],
                capture_output=True, text=True, timeout=300)
            output = result.stdout + result.stderr
            self.assertEqual(result.returncode, 2, output[-4000:])
            self.assertRegex(output, r"shard_00000\.tok: token id check failed: sample \d+ holds token id 300")
            self.assertNotIn("index out of range", output)
            for host in (0, 1):
                self.assertRegex(output, rf"\[host {host}\].*token id 300", f"host {host} must say why it stopped")


if __name__ == "__main__":
    unittest.main()
