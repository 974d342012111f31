"""Training throughput on CPU: online (target in the process) vs offline (extracted shards).

Same samples, same drafter, same steps; every row is a real ``eyas.train.run`` in one
process, so the ratios hold even when absolute speed drifts on a shared machine. Tokens/s
is the median over steps after the first (model load and the first step's allocations are
left out); the extraction an offline run needs first is timed on its own row. The cached
run trains two epochs (its wall time covers both) and reports the second epoch's rate.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python bench/train.py [--samples 48] [--steps 6]``
(embedded target, CPU).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

# The synthetic chat samples of the extraction bench (64–512 tokens, answer under loss).
from extract import make_rows  # noqa: E402  (bench/ is on sys.path when run as a script)

from eyas import extract, merge, train
from eyas.config import RunConfig
from eyas.paths import RunPaths
from eyas.records import tokenized_arrow_schema
from eyas.target import load_tokenizer
from eyas.train.metrics import read_metrics


def timed_train(config: RunConfig, skip: int = 1) -> tuple[float, float]:
    """Wall seconds of the whole run and the median tokens/s of its steps after the first ``skip``."""
    t0 = time.monotonic()
    train.run(config, quiet=True)
    rows = read_metrics(RunPaths.of(config).train_dir / "metrics.jsonl")
    return time.monotonic() - t0, statistics.median(r["tokens_per_s"] for r in rows[skip:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="eyas-train-bench-"))
    small = {
        "ttt_steps": 3,
        "draft_vocab_size": 4096,
        "batch_size": 8,
        "max_steps": args.steps,
        "epochs": 100.0,
        "eval_every": 10_000,
        "checkpoint_every": 10_000,
    }
    base = RunConfig.model_validate(
        {
            "run_dir": str(work / "base"),
            "target": {"device": "cpu"},
            "datasets": [{"name": "bench", "source": "unused.jsonl"}],
            "merge": {"eval_fraction": 0.0},
            "extract": {"mode": "online"},
            "train": small,
        }
    )
    rows = make_rows(load_tokenizer(base.target), args.samples, random.Random(0))
    path = RunPaths.of(base).tokenized("bench")
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=tokenized_arrow_schema()), path)
    merge.run(base, quiet=True)

    def variant(name: str, mode: str = "online", **train_settings) -> RunConfig:
        config = base.model_copy(
            update={
                "run_dir": str(work / name),
                "extract": base.extract.model_copy(update={"mode": mode}),
                "train": base.train.model_copy(update=train_settings),
            }
        )
        (work / name).mkdir()
        os.symlink(RunPaths.of(base).merge_dir, RunPaths.of(config).merge_dir)
        return config

    results = []
    seconds, rate = timed_train(variant("online"))
    results.append(("online: target forward per batch (3 TTT steps, 4,096-id vocab)", seconds, rate))
    offline = variant("offline", "offline")
    t0 = time.monotonic()
    extract.run(offline, quiet=True)
    results.append(("  extraction for offline (once, bf16 shards)", time.monotonic() - t0, None))
    seconds, rate = timed_train(offline)
    results.append(("offline: states read from shards (same drafter)", seconds, rate))
    # Two epochs with the in-memory cache; the rate is the second epoch's, when the target is skipped.
    epoch = args.samples // 8
    seconds, rate = timed_train(variant("cached", cache_states=True, max_steps=2 * epoch), skip=epoch)
    results.append(("online + train.cache_states, second epoch (target skipped)", seconds, rate))
    seconds, rate = timed_train(variant("default", ttt_steps=7, draft_vocab_size=None))
    results.append(("online, default drafter (7 TTT steps, 32,000-id vocab)", seconds, rate))

    tokens = sum(len(r["input_ids"]) for r in rows)
    print(
        f"{len(rows)} samples, {tokens:,} tokens, batch 8, {args.steps} steps, SmolLM2-135M-Instruct (embedded), "
        f"CPU, {torch.get_num_threads()} threads\n"
    )
    print("| run | wall seconds | train tokens/s | vs online |")
    print("|---|---|---|---|")
    online_rate = results[0][2]
    for label, seconds, rate in results:
        cells = (f"{rate:,.0f}", f"{rate / online_rate:.2f}×") if rate else ("", "")
        print(f"| {label} | {seconds:.1f} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
