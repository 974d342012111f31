"""Local generation throughput: batched (left-padded, length-sorted) vs one prompt at a time,
and the vLLM backend (continuous batching) at the same batch size where vLLM is installed.

Same prompts, same model (the embedded SmolLM2-135M-Instruct), same greedy settings; all
runs in one invocation so the ratios hold even when absolute speed drifts on a shared machine.
vLLM's engine start is timed apart from its generation (it happens once per `eyas generate`).

    .venv/bin/python bench/generate_local.py [--prompts 32] [--max-tokens 64] [--batch-size 16]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from eyas.config import ConfigError, TargetConfig
from eyas.target import end_of_turn_id, load_model, load_tokenizer
from eyas.target.generation import Job, LocalGenerator, run_jobs
from eyas.target.settings import Sampling
from eyas.target.vllm import vllm_python
from eyas.target.vllm_engine import VllmGenerator

TOPICS = [
    "rain",
    "volcanoes",
    "bread",
    "chess",
    "the moon",
    "bees",
    "rivers",
    "jazz",
    "glaciers",
    "paper",
    "bicycles",
    "tea",
    "owls",
    "deserts",
    "clocks",
    "salt",
]


def questions(n: int) -> list[str]:
    forms = ["Explain how {} works.", "Write a short story about {}.", "What are three facts about {}?"]
    return [forms[i % len(forms)].format(TOPICS[i % len(TOPICS)]) for i in range(n)]


def measure(generator, jobs: list[Job]) -> tuple[int, float]:
    tokens = 0

    def count(_job, completion):
        nonlocal tokens
        tokens += len(completion.token_ids)

    start = time.perf_counter()
    run_jobs(generator, jobs, count, seed=0)
    return tokens, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    target = TargetConfig(device="cpu")
    tokenizer, model = load_tokenizer(target), load_model(target)
    end = end_of_turn_id(tokenizer)
    jobs = [Job(i, [{"role": "user", "content": q}], []) for i, q in enumerate(questions(args.prompts))]
    rows = []
    greedy = Sampling(max_tokens=args.max_tokens, temperature=0.0, top_p=1.0, seed=0, batch_size=args.batch_size)
    for batch_size in (1, args.batch_size):
        generator = LocalGenerator(model, tokenizer, end, replace(greedy, batch_size=batch_size))
        for job in jobs:
            job.prompt_ids = generator.encode_prompt(job.messages)
        tokens, seconds = measure(generator, jobs)
        rows.append((f"transformers (local), batch {batch_size}", tokens, seconds))
    try:
        vllm_python(None)
    except ConfigError as e:
        Console().print(f"vLLM row skipped: {e}")
    else:
        log_path = Path(tempfile.mkdtemp()) / "vllm.log"
        started = time.perf_counter()
        with VllmGenerator(target, greedy, tokenizer, end, {end}, log_path) as generator:
            generator.generate_batch([jobs[0].prompt_ids], 0, 1)  # waits for the engine to be up
            Console().print(f"vLLM engine start: {time.perf_counter() - started:.1f} s (once per run, not in the row)")
            tokens, seconds = measure(generator, jobs)
        rows.append((f"vLLM, batch {args.batch_size}", tokens, seconds))

    table = Table(title=f"local generation, {args.prompts} prompts, ≤{args.max_tokens} new tokens, greedy")
    for col in ("backend", "tokens", "seconds", "tokens/s", "vs one at a time"):
        table.add_column(col, justify="right")
    base = rows[0][1] / rows[0][2]
    for name, tokens, seconds in rows:
        rate = tokens / seconds
        table.add_row(name, f"{tokens:,}", f"{seconds:.1f}", f"{rate:.1f}", f"{rate / base:.2f}×")
    Console().print(table)


if __name__ == "__main__":
    main()
