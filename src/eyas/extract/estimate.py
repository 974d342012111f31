"""Estimate what offline extraction will cost before spending it: storage, time, and savings.

Storage is tokens × (aux layers + 1) × hidden size × bytes per value (plus each token's id,
mask and fp8 scales: :func:`eyas.extract.plan.bytes_per_token`); fp8 makes only the aux
values 1 byte (final stays bf16, the teacher's exact input), so it saves ≈ 37.5%, not half.
Time is tokens ÷ throughput. The reference job — 138M tokens, hidden size 7,168, 4 layers
in bf16 — comes to ≈ 7.9 TB before any cap (≈ 4.9 TB in fp8), which is why each cap, fp8 and
dataset drop gets its own row.

Inputs come from files that exist early: the target's ``config.json`` alone (no weights),
the merge's ``stats.json`` (or, before merging, the tokenize Parquet files' ``num_tokens``
column), and the extract settings. Everything below :func:`gather` is pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
from rich.table import Table

from eyas.config import ExtractConfig, RunConfig
from eyas.extract.plan import bytes_per_token
from eyas.merge.stats import Histogram, tokens_over
from eyas.paths import RunPaths
from eyas.space import Need, human_bytes

CANDIDATE_CAPS = (2048, 4096, 8192, 16384, 32768)
NUM_AUX = 3


@dataclass(frozen=True)
class Inputs:
    """Everything an estimate depends on."""

    hidden_size: int
    num_layers: int
    histograms: dict[str, list[dict]]
    """Per dataset: length histogram rows ``{lo, hi, samples, tokens}`` (see :mod:`eyas.merge.stats`)."""
    dtype: str
    throughput: float | None
    """Tokens per second; None when neither measured nor configured."""
    source: str
    throughput_source: str
    engine: str = "transformers"
    """The engine that will run the target, with its parallelism, as the table names it."""
    caps: tuple[int, ...] = CANDIDATE_CAPS


@dataclass(frozen=True)
class Line:
    scenario: str
    tokens: float
    bytes: float
    seconds: float | None
    setting: str = ""
    """The config change that gives this line (none for the corpus as configured)."""


def storage_bytes(tokens: float, hidden_size: int, dtype: str) -> float:
    return tokens * bytes_per_token(hidden_size, NUM_AUX, dtype)


def _line(scenario: str, tokens: float, inputs: Inputs, dtype: str, setting: str = "") -> Line:
    seconds = tokens / inputs.throughput if inputs.throughput else None
    return Line(scenario, tokens, storage_bytes(tokens, inputs.hidden_size, dtype), seconds, setting)


def estimate(inputs: Inputs) -> list[Line]:
    """The corpus as it stands, then one line per saving: each cap, fp8, each dataset left out."""
    total = sum(row["tokens"] for h in inputs.histograms.values() for row in h)
    lines = [_line(f"as configured ({inputs.dtype})", total, inputs, inputs.dtype)]
    for cap in sorted(inputs.caps):
        cut = sum(tokens_over(h, cap) for h in inputs.histograms.values())
        if cut > 0:
            cap_line = _line(f"cap at {cap:,} tokens", total - cut, inputs, inputs.dtype, f"merge.max_seq_len: {cap}")
            lines.append(cap_line)
    other = "fp8" if inputs.dtype == "bf16" else "bf16"
    lines.append(_line(f"{other} storage", total, inputs, other, f"extract.dtype: {other}"))
    cut = sum(tokens_over(h, 8192) for h in inputs.histograms.values())
    if other == "fp8" and cut > 0:
        both = "merge.max_seq_len: 8192 and extract.dtype: fp8"
        lines.append(_line("cap at 8,192 tokens + fp8", total - cut, inputs, "fp8", both))
    if len(inputs.histograms) > 1:
        for name, h in inputs.histograms.items():
            without = total - sum(r["tokens"] for r in h)
            lines.append(
                _line(f"without dataset {name}", without, inputs, inputs.dtype, f"datasets[{name}].drop: true")
            )
    return lines


def levers(lines: list[Line]) -> list[str]:
    """The settings that store less than the corpus as configured, each with its figure, and
    online training, which stores nothing."""
    base = lines[0]
    smaller = [f"{line.setting} ({human_bytes(line.bytes)})" for line in lines[1:] if line.bytes < base.bytes]
    return [*smaller, "extract.mode: online (no states stored: training runs the target)"]


def need(config: RunConfig, written: int = 0) -> tuple[Need, list[str]]:
    """What extraction will write beyond the ``written`` bytes of shards already done, by the
    estimate (before generation, from the prompts: :mod:`eyas.generate.expected`), and the
    settings that would store less."""
    inputs = gather(config)
    lines = estimate(inputs)
    what = f"extract: hidden states of about {lines[0].tokens:,.0f} tokens in {inputs.dtype} ({inputs.source})"
    return Need(what, max(0, round(lines[0].bytes) - written)), levers(lines)


def human_seconds(s: float | None) -> str:
    if s is None:
        return "unknown"
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.1f} s"


def table(inputs: Inputs, lines: list[Line]) -> Table:
    base = lines[0]
    t = Table(
        title=f"extraction estimate — hidden {inputs.hidden_size:,}, {inputs.num_layers} layers, "
        f"{NUM_AUX} aux + final states; {inputs.source}; engine {inputs.engine}; throughput {inputs.throughput_source}"
    )
    for column in ("scenario", "tokens", "storage", "time", "saves"):
        t.add_column(column, justify="left" if column == "scenario" else "right")
    for line in lines:
        saved = base.bytes - line.bytes
        saves = "" if line is base else f"{human_bytes(saved)} ({saved / base.bytes:.0%})" if base.bytes else "0"
        t.add_row(line.scenario, f"{line.tokens:,.0f}", human_bytes(line.bytes), human_seconds(line.seconds), saves)
    return t


def gather(config: RunConfig) -> Inputs:
    """Read the inputs: the target's config (no weights), corpus lengths, extract settings."""
    from eyas.target import load_model_config, text_config

    paths = RunPaths.of(config)
    model_config = load_model_config(config.target)
    text = text_config(model_config)
    histograms, source = _corpus(config, paths)
    throughput, throughput_source = config.extract.throughput_tokens_per_s, "assumed (extract.throughput_tokens_per_s)"
    index = paths.hidden_index
    measured = json.loads(index.read_text()) if index.is_file() else {}
    # A measurement beats the assumption, but only one made with the engine configured now.
    if measured.get("tokens_per_s") and config.extract.engine in measured.get("engines", ["transformers"]):
        throughput = measured["tokens_per_s"]
        throughput_source = f"measured by the last extract ({config.extract.engine})"
    if throughput is None:
        throughput_source = "unknown (set extract.throughput_tokens_per_s)"
    else:
        throughput_source = f"{throughput:,.0f} tok/s {throughput_source}"
    return Inputs(
        text.hidden_size,
        text.num_hidden_layers,
        histograms,
        config.extract.dtype,
        throughput,
        source,
        throughput_source,
        engine_description(config.extract),
    )


def engine_description(x: ExtractConfig) -> str:
    """``transformers``, or vLLM with the parallelism it will split the target by."""
    if x.engine == "transformers":
        return "transformers (one replica per torchrun rank)"
    parts = [f"tensor parallel {x.tensor_parallel_size}"]
    if x.pipeline_parallel_size > 1:
        parts.append(f"pipeline parallel {x.pipeline_parallel_size}")
    if x.expert_parallel:
        parts.append("expert parallel")
    return f"vllm ({', '.join(parts)})"


def _corpus(config: RunConfig, paths: RunPaths) -> tuple[dict[str, list[dict]], str]:
    stats = paths.merge_stats
    if stats.is_file():
        data = json.loads(stats.read_text())
        return {name: d["train"]["length_histogram"] for name, d in data["datasets"].items()}, "merged train split"
    import pyarrow.parquet as pq

    histograms = {}
    for d in config.datasets:
        path = paths.tokenized(d.name)
        if d.drop or not path.is_file():
            continue
        h = Histogram()
        h.add(pq.read_table(path, columns=["num_tokens"]).column(0).to_numpy())
        histograms[d.name] = h.to_json()
    if histograms:
        return histograms, "tokenize output (before merge)"
    from eyas.generate.expected import expected

    for name, lengths in expected(config).lengths.items():
        h = Histogram()
        h.add(np.asarray(lengths, dtype=np.int64))
        histograms[name] = h.to_json()
    return histograms, f"expected from the prompts, answers at up to generate.max_tokens {config.generate.max_tokens}"


def run(config: RunConfig, quiet: bool = False) -> list[Line]:
    """Print the estimate table (stdout) and return its lines."""
    from rich.console import Console

    inputs = gather(config)
    lines = estimate(inputs)
    Console().print(table(inputs, lines))
    return lines
