#!/usr/bin/env python3
"""test_plot.py — the picture of a run: metrics.svg, drawn at the end of training and by `meshtrain plot`, rendered
by Debian's headless Chromium.

A short run with evaluation ends by writing <output_dir>/metrics.svg. Chromium renders it to a PNG, which is decoded
here with the standard library (zlib and the PNG row filters) and must show each series in its colour: the training
loss line, the eval-loss points and the compute bars, so the file is a picture a browser draws, not only a file that
exists. `meshtrain plot` redraws the same file; a directory without metrics.jsonl is an error naming it.
"""
import json
import os
import shutil
import struct
import subprocess
import tempfile
import unittest
import zlib

from training_runs import BINARY, train

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# plots/metrics_svg.cpp's colours.
LOSS, EVAL, COMPUTE = (0x1F, 0x77, 0xB4), (0xD6, 0x27, 0x28), (0x2C, 0xA0, 0x2C)
BUBBLE = (0x94, 0x67, 0xBD)


def decode_png(path):
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB or RGBA non-interlaced PNG."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    at, idat, width = 8, b"", None
    while at < len(data):
        (length,), kind = struct.unpack(">I", data[at:at + 4]), data[at + 4:at + 8]
        body = data[at + 8:at + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        at += 12 + length
    raw, stride = zlib.decompress(idat), width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, up_left = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else up_left)) & 0xFF
        rows.append([tuple(line[x * channels:x * channels + 3]) for x in range(width)])
        previous = line
    return width, height, rows


def count_near(rows, colour, tolerance=12):
    return sum(1 for row in rows for px in row if all(abs(a - b) <= tolerance for a, b in zip(px, colour)))


class PlotTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.out = os.path.join(cls.tmp.name, "run")
        _, _, cls.output = train(cls.out, 1, 1, ["max_steps=6", "eval.every_steps=3", "eval.batches=1",
                                                 "ici_mesh.fsdp=1", "metrics.tensorboard=false"])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def render(self, svg):
        png = os.path.join(self.tmp.name, "metrics.png")
        result = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                                 "--window-size=900,660", f"--screenshot={png}", "file://" + os.path.abspath(svg)],
                                capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        return decode_png(png)

    def test_training_ends_with_a_picture_chromium_draws(self):
        svg = os.path.join(self.out, "metrics.svg")
        self.assertIn(f"Plot of the run: {svg}", self.output)
        width, height, rows = self.render(svg)
        self.assertEqual((width, height), (900, 660))
        white = count_near(rows, (255, 255, 255), 0)
        self.assertLess(white, 0.97 * width * height, "the page is blank")
        self.assertGreater(count_near(rows, LOSS), 100, "no training-loss line")
        self.assertGreater(count_near(rows, EVAL), 20, "no eval-loss points")
        self.assertGreater(count_near(rows, COMPUTE), 100, "no compute bars")

    def test_plot_command_redraws_it_and_names_a_missing_file(self):
        svg = os.path.join(self.out, "metrics.svg")
        before = open(svg).read()
        os.remove(svg)
        result = subprocess.run([BINARY, "plot", self.out], capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), svg)
        self.assertEqual(open(svg).read(), before)
        empty = os.path.join(self.tmp.name, "empty")
        os.makedirs(empty)
        result = subprocess.run([BINARY, "plot", empty], capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 2)
        self.assertIn(os.path.join(empty, "metrics.jsonl"), result.stderr)

    def test_a_pipeline_runs_bubble_is_drawn_out_of_its_communication(self):
        # A pipeline run's lines (docs/training.md): device 0's wait for the other stages, stage 0 first.
        run = os.path.join(self.tmp.name, "pipeline")
        os.makedirs(run)
        with open(os.path.join(run, "metrics.jsonl"), "w") as f:
            for step in range(1, 7):
                f.write(json.dumps({"step": step, "loss": 5.0 - 0.1 * step, "compute_s": 0.5, "comm_s": 0.3,
                                    "data_wait_s": 0.01, "pipeline_bubble_s": [0.2, 0.1],
                                    "pipeline_bubble_fraction": 0.19}) + "\n")
        result = subprocess.run([BINARY, "plot", run], capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        svg = os.path.join(run, "metrics.svg")
        self.assertIn("pipeline bubble (stage 0)", open(svg).read())
        _, _, rows = self.render(svg)
        self.assertGreater(count_near(rows, BUBBLE), 100, "no bubble bars")
        self.assertGreater(count_near(rows, COMPUTE), 100, "no compute bars")


if __name__ == "__main__":
    unittest.main()
