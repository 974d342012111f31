"""One round of ``eyas tune``: every cell's server started afresh, every wave of prompts sent
to each in turn, so the machine's drift in that minute falls on all of them alike.

A wave is as many prompts as the cell has requests in flight, sent together by as many
clients; its speed is the tokens decoded over the wall time until the last answer — what the
server delivers, prompt processing included, the same at every load.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from eyas.eval.llamacpp_engine import drafting, log_name, spent, start_server
from eyas.tune.plan import DRAFT, PLAIN, Cell


def server_args(cell: Cell, drafts: dict[str, Path], spec_type: str) -> list[str]:
    """The ``llama-server`` arguments a cell adds to the target's (threads and slots aside);
    ``drafts``: the drafter's file in each GGUF type."""
    if cell.method == PLAIN:
        return []
    if cell.method == DRAFT:
        return drafting(drafts[cell.gguf], spec_type, cell.n, cell.p_min)
    return ["--spec-type", cell.method]


def waves(prompts: list, in_flight: int) -> list[list]:
    return [prompts[i : i + in_flight] for i in range(0, len(prompts), in_flight)]


def measure_round(
    config,
    llamacpp,
    target: Path,
    drafts: dict[str, Path],
    spec_type: str,
    cells: list[Cell],
    prompts: list,
    out_dir: Path,
) -> dict[str, dict]:
    """Cell key -> ``waves`` ([tokens, seconds] each), ``outputs`` (prompt id -> tokens) and
    ``counters`` (llama.cpp's speculative-decoding counters spent in this round)."""
    new_tokens = config.tune.max_new_tokens
    with contextlib.ExitStack() as stack:
        servers = {
            cell: stack.enter_context(
                start_server(
                    config,
                    llamacpp,
                    target,
                    server_args(cell, drafts, spec_type),
                    prompts,
                    out_dir / log_name(cell.key.replace(" ", "-")),
                    new_tokens,
                    cell.threads,
                    cell.in_flight,
                )
            )
            for cell in cells
        }
        pool = stack.enter_context(ThreadPoolExecutor(max(c.in_flight for c in cells)))
        before = {cell: server.counters() for cell, server in servers.items()}
        measured = {cell.key: {"waves": [], "outputs": {}} for cell in cells}
        for index in range(len(prompts)):
            for cell, server in servers.items():
                batches = waves(prompts, cell.in_flight)
                if index >= len(batches):
                    continue
                started = time.monotonic()
                answers = list(pool.map(lambda p: server.complete(p.input_ids, new_tokens), batches[index]))
                seconds = time.monotonic() - started
                measured[cell.key]["waves"].append([sum(a["timings"]["predicted_n"] for a in answers), seconds])
                for prompt, answer in zip(batches[index], answers):
                    measured[cell.key]["outputs"][prompt.id] = answer["tokens"]
        for cell, server in servers.items():
            measured[cell.key]["counters"] = spent(before[cell], server.counters())
    return measured
