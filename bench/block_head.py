"""The block families' output head on a CPU: ``nn.Linear`` on the strided slice of a block's
positions after the first, against :func:`eyas.drafter.families.dflash.project` (one 2-D matrix
product), forward and backward, on the embedded target's head (576 × 49,152).

A block family's step projects every drafted position of every anchored block onto the target's
full vocabulary; on the strided slice ``hidden[:, :, 1:]`` PyTorch's linear runs a batched kernel
that this bench shows is many times slower. Both are timed side by side, alternating, in one
process, so the ratio holds whatever else the machine is doing; run nothing else meanwhile.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python bench/block_head.py [--batch 8] [--anchors 16]
[--block-size 4] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from eyas.config import TargetConfig
from eyas.drafter.families.dflash import project
from eyas.target import load_model


def timed(step) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--anchors", type=int, default=16)
    parser.add_argument("--block-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    model = load_model(TargetConfig(device="cpu"), torch.device("cpu"))
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=False)
    head.weight = torch.nn.Parameter(model.lm_head.weight.detach().float(), requires_grad=False)
    torch.manual_seed(0)
    hidden = torch.randn(args.batch, args.anchors, args.block_size, model.config.hidden_size, requires_grad=True)
    ways = {
        "nn.Linear on the strided slice": lambda: head(hidden[:, :, 1:]).sum().backward(),
        "project (one 2-D product)": lambda: project(head, hidden[:, :, 1:]).sum().backward(),
    }
    for step in ways.values():
        step()  # warm-up
    seconds = {name: [] for name in ways}
    for _ in range(args.repeats):
        for name, step in ways.items():
            seconds[name].append(timed(step))
    positions = args.batch * args.anchors * (args.block_size - 1)
    table = Table(title=f"block head, forward + backward: {positions} positions × {model.config.vocab_size:,} ids")
    for column in ("way", "median s", "ratio"):
        table.add_column(column, justify="left" if column == "way" else "right")
    fastest = statistics.median(seconds["project (one 2-D product)"])
    for name, runs in seconds.items():
        median = statistics.median(runs)
        table.add_row(name, f"{median:.3f}", f"{median / fastest:.1f}×")
    Console().print(table)


if __name__ == "__main__":
    main()
