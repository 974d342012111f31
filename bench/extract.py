"""Extraction throughput and bytes per token: eyas vs the straightforward loop, and eyas's two
engines (transformers in-process, vLLM in its own environment), all on the same samples.

The straightforward loop is what public trainers do: one sample per forward pass with
``output_hidden_states=True`` (every layer's states, and ``lm_head`` over the full
vocabulary), then ``torch.save`` of one file per sample (cast to bf16, as GPU runs store).
eyas: ``eyas.extract.run`` — hooks on three layers, length-sorted batches, sharded
safetensors. Every row of the first table is timed end to end, one model load from the local
cache included. The engine table splits each engine's wall time into start-up (model load;
for vLLM its engine start, once per ``eyas extract``) and the shards themselves, whose
tokens/s is what ``index.json`` records and ``eyas estimate`` uses. It needs vLLM
(``make vllm``); without it that table is left out, saying why.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python bench/extract.py [--samples 24] [--dtype bfloat16]`` (embedded target, CPU).
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from eyas import extract, merge
from eyas.config import ConfigError, RunConfig
from eyas.merge.reader import iter_split
from eyas.paths import RunPaths
from eyas.records import tokenized_arrow_schema
from eyas.target import load_model, load_tokenizer
from eyas.target.capture import default_aux_layers, num_decoder_layers

WORDS = "the model answers questions about science history code and travel with short clear sentences".split()


def make_rows(tokenizer, count: int, rng: random.Random) -> list[dict]:
    """Chat-formatted samples of 64–512 tokens: a user turn (loss 0) and an answer (loss 1)."""
    rows = []
    for i in range(count):
        question = " ".join(rng.choices(WORDS, k=rng.randint(8, 60)))
        answer = " ".join(rng.choices(WORDS, k=rng.randint(40, 400)))
        prompt = list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )
        completion = tokenizer(answer, add_special_tokens=False)["input_ids"][:440] + [
            tokenizer.convert_tokens_to_ids("<|im_end|>")
        ]
        ids = prompt + completion
        rows.append(
            {
                "id": f"bench/p{i}",
                "dataset": "bench",
                "input_ids": ids,
                "loss_mask": [0] * len(prompt) + [1] * len(completion),
                "num_tokens": len(ids),
                "completion_tokens": len(completion),
                "billed_completion_tokens": len(completion),
                "finish_reason": "stop",
                "format": "chatml",
                "flags": [],
            }
        )
    return rows


def straightforward(config: RunConfig, rows: list[dict], out: Path) -> None:
    model = load_model(config.target)
    layers = default_aux_layers(num_decoder_layers(model))
    out.mkdir()
    with torch.inference_mode():
        for i, row in enumerate(rows):
            states = model(torch.tensor([row["input_ids"]]), output_hidden_states=True).hidden_states
            torch.save(
                {
                    "input_ids": torch.tensor(row["input_ids"]),
                    "loss_mask": torch.tensor(row["loss_mask"]),
                    "hidden_state": torch.cat([states[k + 1] for k in layers], -1)[0].bfloat16(),
                    "target": states[-1][0].bfloat16(),
                },
                out / f"data_{i}.ckpt",
            )


def timed(f, *args, **kwargs):
    """Wall and CPU seconds (all threads of this process) of one call, and its result."""
    wall, cpu = time.monotonic(), time.process_time()
    result = f(*args, **kwargs)
    return time.monotonic() - wall, time.process_time() - cpu, result


def eyas_extract(config: RunConfig, **settings) -> dict:
    return extract.run(config.model_copy(update={"extract": config.extract.model_copy(update=settings)}), quiet=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="target.dtype for both methods"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="eyas-extract-bench-"))
    base = RunConfig.model_validate(
        {
            "run_dir": str(work / "run"),
            "target": {"device": "cpu", "dtype": args.dtype},
            "datasets": [{"name": "bench", "source": "unused.jsonl"}],
            "merge": {"eval_fraction": 0.0},
        }
    )
    rows = make_rows(load_tokenizer(base.target), args.samples, random.Random(0))
    path = RunPaths.of(base).tokenized("bench")
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=tokenized_arrow_schema()), path)
    merge.run(base, quiet=True)
    train = list(iter_split(RunPaths.of(base), "train"))
    tokens = sum(len(r["input_ids"]) for r in train)

    # Warm up (oneDNN kernels, allocator) so the first method timed does not pay for it.
    with torch.inference_mode():
        load_model(base.target)(torch.tensor([train[0]["input_ids"]]))
    results = []
    wall, cpu, _ = timed(straightforward, base, train, work / "loop")
    files = list((work / "loop").iterdir())
    results.append(
        (
            "straightforward loop (1 sample/forward, output_hidden_states, torch.save, bf16)",
            wall,
            cpu,
            len(files),
            sum(f.stat().st_size for f in files),
        )
    )
    for label, run_dir, settings in (
        ("eyas extract, bf16, padded batches", "bf16", {"dtype": "bf16", "packing": "padded"}),
        (
            "eyas extract, bf16, packed (pad-free)",
            "packed",
            {"dtype": "bf16", "packing": "packed", "batch_tokens": 2048},
        ),
        ("eyas extract, fp8, padded batches", "fp8", {"dtype": "fp8", "packing": "padded"}),
    ):
        config = base.model_copy(update={"run_dir": str(work / run_dir)})
        (work / run_dir).mkdir()
        os.symlink(RunPaths.of(base).merge_dir, RunPaths.of(config).merge_dir)
        wall, cpu, index = timed(eyas_extract, config, **settings)
        results.append((label, wall, cpu, 2 * len(index["shards"]) + 1, index["bytes"]))

    engines = []
    for engine in ("transformers", "vllm"):
        config = base.model_copy(update={"run_dir": str(work / engine)})
        (work / engine).mkdir()
        os.symlink(RunPaths.of(base).merge_dir, RunPaths.of(config).merge_dir)
        try:
            wall, _, index = timed(eyas_extract, config, dtype="bf16", packing="padded", engine=engine)
        except ConfigError as e:
            engines.append((engine, str(e)))
            continue
        shard_seconds = index["num_tokens"] / index["tokens_per_s"]
        engines.append((engine, (wall, wall - shard_seconds, index["tokens_per_s"])))

    print(
        f"{len(train)} samples, {tokens:,} tokens, SmolLM2-135M-Instruct (embedded), CPU, target.dtype {args.dtype}, {torch.get_num_threads()} threads\n"
    )
    print(
        f"load average {os.getloadavg()[0]:.1f} (2 cores shared with other jobs: CPU-seconds are the steadier figure)\n"
    )
    print(
        "| method | wall s | tokens/s | speed-up (wall) | CPU s | tokens per CPU-s | speed-up (CPU) | files | bytes/token |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    _, loop_wall, loop_cpu, _, _ = results[0]
    for label, wall, cpu, nfiles, nbytes in results:
        print(
            f"| {label} | {wall:.1f} | {tokens / wall:,.0f} | {loop_wall / wall:.2f}× | {cpu:.1f} | {tokens / cpu:,.0f} "
            f"| {loop_cpu / cpu:.2f}× | {nfiles} | {nbytes / tokens:,.0f} |"
        )
    print("\n| engine (eyas extract, bf16, padded) | wall s | start-up s | shards tokens/s | vs transformers |")
    print("|---|---|---|---|---|")
    reference = dict(engines)["transformers"][2]
    for engine, figures in engines:
        if isinstance(figures, str):
            print(f"| {engine} | not run: {figures} | | | |")
            continue
        wall, start, rate = figures
        print(f"| {engine} | {wall:.1f} | {start:.1f} | {rate:,.0f} | {rate / reference:.2f}× |")


if __name__ == "__main__":
    main()
