"""Which drafter family decodes faster on the user's prompts: the drafters of a run that trains
several (``train.drafter: [eagle3, dflash]``), each evaluated on the same held-out prompts,
side by side in ``<run_dir>/families.json`` and a printed table (``families-<name>.json`` for an
evaluation on other prompts or in another engine).

The verdict goes by decode speed, not τ: a family that accepts more per pass but costs more
per draft can still be slower. Speed is the serving engine's where eval ran one
(``eval.engine: llamacpp``: each family's best draft length against llama.cpp's plain decoding
in the same round), else vLLM's where only vLLM ran the target (``eval.in_process: false``),
else eyas's own in-process decoding; the table says which. A family whose
outputs differed from plain decoding is shown but never named the faster.
"""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from eyas.config import RunConfig
from eyas.console import console
from eyas.eval.report import lossless_failures
from eyas.eval.vllm_engine import method_name
from eyas.files import write_json_atomic

ENGINE_BASIS = "llama.cpp decode speed-up (best draft length)"
VLLM_BASIS = "vLLM decode speed-up (eval.in_process: false)"
IN_PROCESS_BASIS = "eyas in-process decode speed-up (set eval.engine: llamacpp to measure in an engine)"


def families_file(config: RunConfig, name: str | None = None) -> Path:
    """``families.json``, or ``families-<name>.json`` for an evaluation with overrides (other
    prompts or engine, see :func:`eyas.eval.with_overrides`), which never replaces the run's."""
    return Path(config.run_dir) / (f"families-{name}.json" if name else "families.json")


def report_families(config: RunConfig, reports: dict[str, dict], quiet: bool, name: str | None = None) -> dict:
    """Compare, write :func:`families_file`, and print the table and the verdict unless ``quiet``."""
    summary = compare(reports)
    write_json_atomic(families_file(config, name), summary)
    if not quiet:
        console.print(families_table(summary))
        console.print(summary["verdict"])
    return summary


def verdict(summary: dict) -> str:
    """The sentence a user acts on."""
    faster = summary["faster"]
    if faster is None:
        return "no drafter family decoded losslessly: see each family's eval report"
    rows = summary["families"]
    others = ", ".join(f"{f} {r['speedup']:.2f}×" for f, r in rows.items() if f != faster and r["speedup"] is not None)
    line = f"faster on these prompts: {faster}, {rows[faster]['speedup']:.2f}× plain speed"
    return line + (f" (against {others})" if others else "") + f"; by {summary['basis']}"


def compare(reports: dict[str, dict]) -> dict:
    """The families side by side from their eval reports (family -> report); ``faster`` is None
    when no family decoded losslessly."""
    in_engine = all("llamacpp" in r for r in reports.values())
    vllm_only = all(family not in r["methods"] for family, r in reports.items())
    rows = {family: _row(family, report, in_engine, vllm_only) for family, report in reports.items()}
    lossless = [f for f, row in rows.items() if row["lossless"]]
    summary = {
        "basis": ENGINE_BASIS if in_engine else VLLM_BASIS if vllm_only else IN_PROCESS_BASIS,
        "prompts": next(iter(reports.values()))["prompts"],
        "faster": max(lossless, key=lambda f: rows[f]["speedup"] or 0.0) if lossless else None,
        "families": rows,
    }
    summary["verdict"] = verdict(summary)
    return summary


def _row(family: str, report: dict, in_engine: bool, vllm_only: bool) -> dict:
    """A family's figures from its report: eyas's own row, or vLLM's where only vLLM ran the target."""
    own = report["methods"][method_name(family) if vllm_only else family]
    row = {
        "tau": own["tau"],
        "per_position": own["per_position"],
        "speedup": own["speedup"],
        "lossless": not any(_is_own(method, family) for method in lossless_failures(report)),
        "draft": report["draft"],
    }
    if in_engine:
        section = report["llamacpp"]
        best = section["methods"][section["best_draft"]]
        row |= {"speedup": best["speedup"], "best_draft": section["best_draft"], "llamacpp_tau": best["tau"]}
    return row


def _is_own(method: str, family: str) -> bool:
    """Whether a report row is the family's drafter: eyas's ``dflash``, vLLM's ``dflash (vllm)``,
    llama.cpp's ``dflash, n=2 (llama.cpp)`` (not prompt lookup or n-grams, which are no family's)."""
    return method == family or method.startswith((f"{family} (", f"{family}, "))


def families_table(summary: dict) -> Table:
    rows = summary["families"]
    k = len(next(iter(rows.values()))["per_position"])
    t = Table(title=f"drafter families on {summary['prompts']} held-out prompts")
    for col in ("family", "τ", *(f"acc@{i + 1}" for i in range(k)), "speed-up", "lossless"):
        t.add_column(col, justify="left" if col == "family" else "right")
    for family, row in rows.items():
        speed = f"{row['speedup']:.2f}×" if row["speedup"] is not None else ""
        t.add_row(
            family + (" (faster)" if family == summary["faster"] else ""),
            f"{row['tau']:.2f}",
            *[f"{a:.2f}" for a in row["per_position"]],
            speed + (f" ({row['best_draft']})" if "best_draft" in row else ""),
            "yes" if row["lossless"] else "NO",
        )
    t.caption = f"speed-up: {summary['basis']}"
    return t
