"""Merge at the reference job's scale (138M tokens) on synthetic data, and report peak memory.

The merge runs in a child process so its peak RSS (``ru_maxrss``) is its own. Token ids are
random, lengths follow the reference shape (nine chat-like datasets plus one of long agentic
traces). Usage: ``.venv/bin/python bench/merge.py [--tokens 138e6] [--dir /tmp/eyas-merge-bench]``.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eyas.records import tokenized_arrow_schema

CHILD = """
import sys, time
from eyas.config import load_config
from eyas import merge
t = time.monotonic()
stats = merge.run(load_config(sys.argv[1]), quiet=True)
print(f"{stats['train']['samples']} {stats['train']['tokens']} {stats['eval']['samples']} {time.monotonic() - t:.1f}")
"""


def write_dataset(path: Path, name: str, lengths: np.ndarray, rng: np.random.Generator, chunk: int = 2000) -> None:
    schema = tokenized_arrow_schema()
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, len(lengths), chunk):
            part = lengths[start : start + chunk]
            offsets = np.concatenate([[0], np.cumsum(part)]).astype(np.int32)
            total = int(offsets[-1])
            ids = pa.ListArray.from_arrays(offsets, pa.array(rng.integers(0, 49152, total, dtype=np.int32)))
            prompt = np.minimum(part // 4, 512)
            mask_values = np.ones(total, np.uint8)
            for o, p in zip(offsets[:-1], prompt):
                mask_values[o : o + p] = 0
            masks = pa.ListArray.from_arrays(offsets, pa.array(mask_values))
            n = len(part)
            table = pa.table(
                {
                    "id": [f"{name}/p{start + i}" for i in range(n)],
                    "dataset": [name] * n,
                    "input_ids": ids,
                    "loss_mask": masks,
                    "num_tokens": part.astype(np.int64),
                    "completion_tokens": (part - prompt).astype(np.int64),
                    "billed_completion_tokens": (part - prompt).astype(np.int64),
                    "finish_reason": ["stop"] * n,
                    "format": ["chatml"] * n,
                    "flags": [[] for _ in range(n)],
                },
                schema=schema,
            )
            writer.write_table(table)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=float, default=138e6)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/eyas-merge-bench"))
    parser.add_argument("--bucket-mb", type=int, default=256)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    shutil.rmtree(args.dir, ignore_errors=True)
    (args.dir / "run" / "tokenize").mkdir(parents=True)
    corpus = {f"chat{i}": rng.integers(200, 7000, 3900) for i in range(9)}
    corpus["agentic"] = rng.integers(12_000, 20_000, 2900)
    scale = args.tokens / sum(int(v.sum()) for v in corpus.values())
    t = time.monotonic()
    for name, lengths in corpus.items():
        write_dataset(
            args.dir / "run" / "tokenize" / f"{name}.parquet",
            name,
            np.maximum(2, (lengths * scale).astype(np.int64)),
            rng,
        )
    made = time.monotonic() - t
    datasets = "".join(f"  - {{name: {n}, source: unused.jsonl}}\n" for n in corpus)
    config = args.dir / "run.yaml"
    config.write_text(
        f"run_dir: run\ndatasets:\n{datasets}merge:\n  max_seq_len: 8192\n  bucket_mb: {args.bucket_mb}\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(config)], capture_output=True, text=True, check=True
    ).stdout.split()
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    input_mb = sum(p.stat().st_size for p in (args.dir / "run" / "tokenize").iterdir()) / 1e6
    print(
        "| input tokens | input Parquet | train samples | train tokens (cap 8,192) | eval samples | bucket_mb | merge time | peak RSS |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {args.tokens / 1e6:.0f}M | {input_mb:,.0f} MB | {int(out[0]):,} | {int(out[1]):,} | {int(out[2]):,} | {args.bucket_mb} | {float(out[3]):.0f} s | {peak_mb:,.0f} MB |"
    )
    print(f"(synthetic input written in {made:.0f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
