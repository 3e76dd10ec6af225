#!/usr/bin/env python3
"""test_tokens_cli.py — `meshtrain tokenize` and `meshtrain prepare` as a user runs them.

tokenize prints ids separated by single spaces and --decode inverts it; prepare writes a shard directory whose
shard file is read back here with an independent parser of the format in docs/formats.md (header fields, CRC-32C,
document offsets), and whose tokens equal `meshtrain tokenize` of each document; a bad input is an error that names
the file and line and leaves no directory behind. GPT-2 cases are skipped when the assets are not installed.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

BINARY = os.environ.get("MESHTRAIN_BINARY", "")
SOURCE = os.environ.get("MESHTRAIN_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
ASSETS = os.environ.get("MESHTRAIN_ASSETS_DIR", os.path.join(SOURCE, "assets"))
HAVE_GPT2 = os.path.exists(os.path.join(ASSETS, "npm", "gpt-tokenizer", "data", "r50k_base.tiktoken"))


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def meshtrain(*args, input=None, check=True):
    result = subprocess.run([BINARY, *args], input=input, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(f"meshtrain {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result


def read_shard(path):
    """Parses a .tok file independently of the C++ reader: (tokens, document starts)."""
    data = open(path, "rb").read()
    assert data[:8] == b"MTTOKENS", "magic"
    version, header_bytes, token_bytes = struct.unpack_from("<III", data, 8)
    token_count, document_count, tokens_offset, documents_offset, file_bytes = struct.unpack_from("<5Q", data, 24)
    (payload_crc,) = struct.unpack_from("<I", data, 64)
    (header_crc,) = struct.unpack_from("<I", data, 252)
    assert (version, header_bytes, tokens_offset) == (1, 256, 256)
    assert header_crc == crc32c(data[:252]), "header checksum"
    assert file_bytes == len(data), "file size"
    assert payload_crc == crc32c(data[256:]), "payload checksum"
    fmt = "<%d%s" % (token_count, "H" if token_bytes == 2 else "I")
    tokens = list(struct.unpack_from(fmt, data, tokens_offset))
    starts = list(struct.unpack_from("<%dQ" % (document_count + 1), data, documents_offset))
    return tokens, starts


class TokenizeTest(unittest.TestCase):
    def test_byte_tokenizer_round_trip(self):
        self.assertEqual(meshtrain("tokenize", "--tokenizer", "byte", "hi", "é").stdout, "104 105 32 195 169\n")
        self.assertEqual(meshtrain("tokenize", "--tokenizer", "byte", "--decode", "104 105").stdout, "hi\n")

    @unittest.skipUnless(HAVE_GPT2, "gpt2 assets not installed (scripts/fetch_assets.sh)")
    def test_gpt2_known_ids_and_special_tokens(self):
        self.assertEqual(meshtrain("tokenize", "--tokenizer", "gpt2", "hello world").stdout, "31373 995\n")
        self.assertEqual(meshtrain("tokenize", "-t", "gpt2", "a<|endoftext|>b").stdout, "64 50256 65\n")
        self.assertNotIn("50256", meshtrain("tokenize", "-t", "gpt2", "--special-as-text", "a<|endoftext|>b").stdout)
        self.assertEqual(meshtrain("tokenize", "-t", "gpt2", "--decode", "31373", "995").stdout, "hello world\n")
        text = "Call me Ishmael.\n  Some years ago—never mind how long"
        ids = meshtrain("tokenize", "-t", "gpt2", input=text).stdout
        self.assertEqual(meshtrain("tokenize", "-t", "gpt2", "--decode", input=ids).stdout, text + "\n")

    def test_unknown_tokenizer_is_a_user_error(self):
        result = meshtrain("tokenize", "--tokenizer", "nope", "x", check=False)
        self.assertEqual(result.returncode, 2)
        self.assertIn("tokenizer 'nope' is neither a known name", result.stderr)


class PrepareTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.texts = ["First document.", "Second: with <|endoftext|> inside", "Third\n\nwith  spaces "]
        with open(os.path.join(self.dir, "corpus.jsonl"), "w") as f:
            for text in self.texts:
                f.write(json.dumps({"body": text}) + "\n")

    def tearDown(self):
        self.tmp.cleanup()

    def prepare(self, tokenizer, *extra, check=True):
        out = os.path.join(self.dir, "shards")
        result = meshtrain("prepare", "--tokenizer", tokenizer, "--output", out, "--text-field", "body", *extra,
                           os.path.join(self.dir, "corpus.jsonl"), check=check)
        return out, result

    def check_shards(self, tokenizer, separator):
        out, _ = self.prepare(tokenizer)
        index = json.load(open(os.path.join(out, "index.json")))
        self.assertEqual(index["format"], "meshtrain-token-shards")
        self.assertEqual(index["documents"], 3)
        tokens, starts = read_shard(os.path.join(out, index["shards"][0]["file"]))
        self.assertEqual(len(tokens), index["tokens"])
        for d, text in enumerate(self.texts):
            expected = [] if separator is None else [separator]
            ids = meshtrain("tokenize", "-t", tokenizer, "--special-as-text", input=text).stdout.split()
            expected += [int(i) for i in ids]
            self.assertEqual(tokens[starts[d]:starts[d + 1]], expected, text)

    def test_byte_shards(self):
        self.check_shards("byte", None)

    @unittest.skipUnless(HAVE_GPT2, "gpt2 assets not installed (scripts/fetch_assets.sh)")
    def test_gpt2_shards(self):
        self.check_shards("gpt2", 50256)

    def test_bad_field_names_file_and_line_and_leaves_nothing(self):
        with open(os.path.join(self.dir, "corpus.jsonl"), "a") as f:
            f.write('{"text": "no body"}\n')
        out, result = self.prepare("byte", check=False)
        self.assertEqual(result.returncode, 2)
        self.assertIn("corpus.jsonl:4: expected a string field \"body\"", result.stderr)
        self.assertEqual(sorted(os.listdir(self.dir)), ["corpus.jsonl"])


if __name__ == "__main__":
    if not BINARY:
        sys.exit("MESHTRAIN_BINARY is not set")
    unittest.main()
