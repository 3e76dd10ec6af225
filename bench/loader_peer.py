"""loader_peer.py — the loader Python users reach for, as loader_bench's peer: a PyTorch DataLoader with a
DistributedSampler over a NumPy memmap of the same token shards (meshtrain's .tok format, docs/formats.md).

Sample i is tokens [i * block_size, i * block_size + block_size + 1) of the shards' concatenated stream, as in
meshtrain; __getitem__ copies it into an int32 tensor (nanoGPT-style) and the DataLoader stacks `rows` of them into one
[rows, block_size + 1] batch for rank `host` of `hosts`. Prints one JSON line: tokens/s (input tokens, median of runs)
and the batches timed. Run by /usr/bin/python3 (Debian's python3-torch).
"""
import argparse
import json
import os
import statistics
import struct
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def open_shards(directory):
    """One read-only memmap of the tokens of each shard listed in index.json."""
    with open(os.path.join(directory, "index.json")) as f:
        index = json.load(f)
    maps = []
    for shard in index["shards"]:
        path = os.path.join(directory, shard["file"])
        with open(path, "rb") as f:
            header = f.read(256)
        assert header[:8] == b"MTTOKENS", path
        token_bytes, = struct.unpack_from("<I", header, 16)
        token_count, = struct.unpack_from("<Q", header, 24)
        tokens_offset, = struct.unpack_from("<Q", header, 40)
        dtype = np.uint16 if token_bytes == 2 else np.uint32
        maps.append(np.memmap(path, dtype=dtype, mode="r", offset=tokens_offset, shape=(token_count,)))
    return maps


class PackedTokens(Dataset):
    def __init__(self, directory, block_size):
        self.shards = open_shards(directory)
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])
        self.block_size = block_size

    def __len__(self):
        return (int(self.starts[-1]) - 1) // self.block_size

    def __getitem__(self, i):
        begin, end = i * self.block_size, i * self.block_size + self.block_size + 1
        s = int(np.searchsorted(self.starts, begin, side="right")) - 1
        if end <= self.starts[s + 1]:
            chunk = self.shards[s][begin - self.starts[s]:end - self.starts[s]]
        else:  # straddles shards
            pieces, at = [], begin
            while at < end:
                piece_end = min(end, int(self.starts[s + 1]))
                pieces.append(self.shards[s][at - self.starts[s]:piece_end - self.starts[s]])
                at, s = piece_end, s + 1
            chunk = np.concatenate(pieces)
        return torch.from_numpy(chunk.astype(np.int32))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--block-size", type=int, required=True)
    parser.add_argument("--rows", type=int, required=True, help="rows per host batch")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--host", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--prefetch", type=int, default=2)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    torch.set_num_threads(1)

    dataset = PackedTokens(args.dataset, args.block_size)
    sampler = DistributedSampler(dataset, num_replicas=args.hosts, rank=args.host, shuffle=True, seed=args.seed,
                                 drop_last=True)
    loader = DataLoader(dataset, batch_size=args.rows, sampler=sampler, drop_last=True, num_workers=args.workers,
                        prefetch_factor=args.prefetch if args.workers else 2, persistent_workers=args.workers > 0)

    def batches():
        epoch = 0
        while True:
            sampler.set_epoch(epoch)
            for batch in loader:
                yield batch
            epoch += 1

    stream = batches()
    for _ in range(3):  # warm-up: worker start and first epoch
        next(stream)
    rates = []
    for _ in range(args.runs):
        start = time.perf_counter()
        for _ in range(args.batches):
            batch = next(stream)
        seconds = time.perf_counter() - start
        assert batch.shape == (args.rows, args.block_size + 1) and batch.dtype == torch.int32
        rates.append(args.rows * args.block_size * args.batches / seconds)
    print(json.dumps({"tokens_per_s": statistics.median(rates), "runs": rates, "batches": args.batches,
                      "samples": len(dataset)}))


if __name__ == "__main__":
    main()
