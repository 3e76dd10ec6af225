#!/usr/bin/env python3
"""test_eval_tensorboard.py — held-out evaluation and TensorBoard event files, as a user's run writes them.

llama-tiny trains 4 steps with an evaluation every 2 steps on 1 device and as 2 real host processes on two layouts
(dcn data=2 x ici fsdp=2; dcn fsdp=2 x ici tensor=2). The eval loss of each evaluation must equal the single-device
one up to floating-point reordering (the tolerance of slow_test_parallel_parity.py) and every host must print the
same one. Host 0's TensorBoard event file is read back with an independent reader written here from the format
(TFRecord framing with masked CRC-32C; Event, Summary and Summary.Value protobuf fields decoded by hand): its
scalars must equal metrics.jsonl's numbers (as float32, what simple_value holds). Which samples are held out is
tested in tests/data/pipeline_test.cpp (by sample id).
"""
import glob
import json
import math
import os
import re
import struct
import tempfile
import unittest

from test_tokens_cli import crc32c
from training_runs import train

STEPS = 4
EVAL = ["eval.every_steps=2", "eval.batches=2", f"max_steps={STEPS}"]
EVAL_TOKENS = 2 * 8 * 64  # eval.batches x global_batch_size x block_size (training_runs.BASE)
LAYOUTS = {
    "dcn data=2 x ici fsdp=2": (2, 2, ["dcn_mesh.data=2", "ici_mesh.fsdp=2"]),
    "dcn fsdp=2 x ici tensor=2": (2, 2, ["dcn_mesh.fsdp=2", "ici_mesh.fsdp=1", "ici_mesh.tensor=2",
                                         "metrics.tensorboard=false"]),
}
EVAL_LINE = re.compile(r"^\[host (\d+)\].*eval at step (\d+)/\d+: eval_loss \(global mean\): ([0-9.]+)")
# TensorBoard tag -> metrics.jsonl key (metrics.hpp).
TAGS = {"train/loss": "loss", "train/grad_norm": "grad_norm", "train/lr": "lr",
        "throughput/tokens_per_s": "tokens_per_s", "throughput/tokens_per_s_per_device": "tokens_per_s_per_device",
        "throughput/mfu": "mfu", "time/step_time_s": "step_time_s", "time/data_wait_s": "data_wait_s",
        "time/compute_s": "compute_s", "time/comm_s": "comm_s", "memory/peak_rss_gb": "peak_rss_gb",
        "eval/eval_loss": "eval_loss", "eval/eval_perplexity": "eval_perplexity"}


def masked_crc(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path):
    """The payload of every TFRecord in `path`, each CRC checked."""
    records = []
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        header = data[at:at + 12]
        (length,), (length_crc,) = struct.unpack("<Q", header[:8]), struct.unpack("<I", header[8:])
        assert length_crc == masked_crc(header[:8]), f"{path}: length CRC at byte {at}"
        payload = data[at + 12:at + 12 + length]
        (payload_crc,) = struct.unpack("<I", data[at + 12 + length:at + 16 + length])
        assert payload_crc == masked_crc(payload), f"{path}: payload CRC at byte {at}"
        records.append(payload)
        at += 16 + length
    return records


def varint(data, at):
    value, shift = 0, 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def fields(message):
    """[(field number, value)]: varints as ints, fixed64/fixed32 as raw bytes, length-delimited as bytes."""
    out, at = [], 0
    while at < len(message):
        key, at = varint(message, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = varint(message, at)
        elif wire == 1:
            value, at = message[at:at + 8], at + 8
        elif wire == 2:
            length, at = varint(message, at)
            value, at = message[at:at + length], at + length
        elif wire == 5:
            value, at = message[at:at + 4], at + 4
        else:
            raise AssertionError(f"wire type {wire}")
        out.append((number, value))
    return out


def read_events(path):
    """[(step, file_version or None, {tag: float})] of every Event in the file (event.proto's field numbers)."""
    events = []
    for record in read_records(path):
        step, version, scalars = 0, None, {}
        for number, value in fields(record):
            if number == 2:
                step = value
            elif number == 3:
                version = value.decode()
            elif number == 5:  # Summary
                for summary_number, entry in fields(value):
                    assert summary_number == 1
                    tag, simple = None, None
                    for value_number, v in fields(entry):
                        if value_number == 1:
                            tag = v.decode()
                        elif value_number == 2:
                            (simple,) = struct.unpack("<f", v)
                    scalars[tag] = simple
        events.append((step, version, scalars))
    return events


def metrics_rows(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def eval_losses(out):
    return {row["step"]: row["eval_loss"] for row in metrics_rows(out) if "eval_loss" in row}


def as_float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


class EvalTensorBoardTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.one = os.path.join(cls.tmp.name, "one")
        _, _, cls.one_output = train(cls.one, 1, 1, [*EVAL, "ici_mesh.fsdp=1"])
        cls.reference = eval_losses(cls.one)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_eval_rows_every_two_steps_and_after_the_last(self):
        rows = [row for row in metrics_rows(self.one) if "eval_loss" in row]
        self.assertEqual([row["step"] for row in rows], [2, 4])
        for row in rows:
            self.assertAlmostEqual(row["eval_perplexity"], math.exp(row["eval_loss"]), delta=1e-9 * row["eval_perplexity"])
            self.assertEqual(row["eval_tokens"], EVAL_TOKENS)
        self.assertLess(rows[1]["eval_loss"], rows[0]["eval_loss"])  # 2 more steps of training lower it
        self.assertIn("Eval data ", self.one_output)
        self.assertIn("held out for evaluation", self.one_output)

    def check_layout(self, name):
        hosts, devices, overrides = LAYOUTS[name]
        out = os.path.join(self.tmp.name, re.sub(r"[^a-z0-9]+", "_", name))
        _, _, output = train(out, hosts, devices, [*EVAL, *overrides])
        got = eval_losses(out)
        self.assertEqual(sorted(got), sorted(self.reference), name)
        for step, want in self.reference.items():
            self.assertAlmostEqual(got[step], want, delta=2e-4 * abs(want), msg=f"{name}: eval at step {step}")
        printed = {}
        for line in output.splitlines():
            m = EVAL_LINE.match(line)
            if m:
                printed.setdefault(int(m.group(1)), {})[int(m.group(2))] = m.group(3)
        self.assertEqual(sorted(printed), list(range(hosts)), f"{name}: every host logs the eval loss\n{output[-3000:]}")
        for host in range(1, hosts):
            self.assertEqual(printed[host], printed[0], f"{name}: host {host} printed another eval loss")
        return out

    def test_eval_loss_equal_on_data_fsdp_mesh(self):
        self.check_layout("dcn data=2 x ici fsdp=2")

    def test_eval_loss_equal_on_fsdp_tensor_mesh_and_tensorboard_off(self):
        out = self.check_layout("dcn fsdp=2 x ici tensor=2")
        self.assertFalse(os.path.exists(os.path.join(out, "tensorboard")), "metrics.tensorboard=false wrote events")

    def test_event_file_holds_the_metrics_jsonl_numbers(self):
        files = glob.glob(os.path.join(self.one, "tensorboard", "events.out.tfevents.*"))
        self.assertEqual(len(files), 1, files)
        events = read_events(files[0])
        self.assertEqual(events[0][1], "brain.Event:2")
        by_step = {}
        for step, _, scalars in events[1:]:
            by_step.setdefault(step, {}).update(scalars)
        rows = {}
        for row in metrics_rows(self.one):
            rows.setdefault(row["step"], {}).update(row)
        self.assertEqual(sorted(by_step), sorted(rows))
        for step, scalars in by_step.items():
            self.assertIn("train/loss", scalars)
            for tag, value in scalars.items():
                key = TAGS[tag]
                self.assertEqual(value, as_float32(rows[step][key]), f"step {step}: {tag} != metrics.jsonl {key}")
        self.assertIn("eval/eval_loss", by_step[2])
        self.assertIn("eval/eval_loss", by_step[4])
        self.assertIn("throughput/mfu", by_step[1])  # training_runs sets metrics.peak_gflops


if __name__ == "__main__":
    unittest.main()
