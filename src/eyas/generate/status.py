"""``eyas status``: how far generation has got, per dataset."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table

from eyas.config import RunConfig
from eyas.generate.store import scan
from eyas.generate.wanted import wanted
from eyas.jsonl import read_jsonl
from eyas.paths import RunPaths
from eyas.prompts import PromptStats


@dataclass
class DatasetStatus:
    name: str
    prompts: int
    done: int
    completion_tokens: int
    output_token_target: int | None
    finish_reasons: dict[str, int]
    errors: int


def collect(config: RunConfig) -> list[DatasetStatus]:
    paths = RunPaths.of(config)
    rows = []
    for d in config.datasets:
        stats = PromptStats()
        turns = sum(1 for _ in wanted(d, config.generate.samples_per_prompt, stats))
        progress = scan(paths.generations(d.name))
        errors_path = paths.generation_errors(d.name)
        errors = sum(1 for _ in read_jsonl(errors_path)) if errors_path.exists() else 0
        rows.append(
            DatasetStatus(
                d.name,
                turns,
                len(progress.done),
                progress.completion_tokens,
                d.output_token_target,
                dict(progress.finish_reasons),
                errors,
            )
        )
    return rows


def table(rows: list[DatasetStatus]) -> Table:
    t = Table(title="generation status")
    for col in ("dataset", "prompts", "done", "completion tokens", "target", "finish reasons", "errors"):
        t.add_column(col, justify="left" if col in ("dataset", "finish reasons") else "right")
    for r in rows:
        target = f"{r.output_token_target:,}" if r.output_token_target else "-"
        reasons = ", ".join(f"{k} {v}" for k, v in sorted(r.finish_reasons.items())) or "-"
        t.add_row(r.name, f"{r.prompts:,}", f"{r.done:,}", f"{r.completion_tokens:,}", target, reasons, str(r.errors))
    return t
