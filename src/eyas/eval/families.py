"""Which drafter family decodes faster on the user's prompts: the drafters of a run that trains
several (``train.drafter: [eagle3, dflash]``), each evaluated on the same held-out prompts,
side by side in ``<run_dir>/families.json`` and a printed table (``families-<name>.json`` for an
evaluation on other prompts or in another engine).

The verdict goes by decode speed, not τ: a family that accepts more per pass but costs more
per draft can still be slower. Speed is the serving engine's where eval ran one
(``eval.engine: llamacpp``: each family's best draft length against llama.cpp's plain decoding
in the same round), else vLLM's where only vLLM ran the target (``eval.in_process: false``),
else eyas's own in-process decoding; the table says which. A family whose
outputs differed from plain decoding is shown but never named the faster, and when no family
beats plain decoding and the draftless speculation measured beside it (llama.cpp's n-gram
methods, eyas's prompt lookup), the verdict says to ship no drafter.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from eyas.config import RunConfig
from eyas.console import console
from eyas.eval.llamacpp_engine import NGRAM_TYPES
from eyas.eval.report import lossless_failures
from eyas.eval.vllm_engine import method_name
from eyas.files import write_json_atomic
from eyas.paths import RunPaths
from eyas.speculate.lookup import PromptLookup
from eyas.stage import StageState, digest, read_marker

ENGINE_BASIS = "llama.cpp decode speed-up (best draft length)"
VLLM_BASIS = "vLLM decode speed-up (eval.in_process: false)"
IN_PROCESS_BASIS = "eyas in-process decode speed-up (set eval.engine: llamacpp to measure in an engine)"


def families_file(config: RunConfig, name: str | None = None) -> Path:
    """``families.json``, or ``families-<name>.json`` for an evaluation with overrides (other
    prompts or engine, see :func:`eyas.eval.with_overrides`), which never replaces the run's."""
    return Path(config.run_dir) / (f"families-{name}.json" if name else "families.json")


def report_families(config: RunConfig, reports: dict[str, dict], quiet: bool, name: str | None = None) -> dict:
    """Compare, write :func:`families_file`, and print the table and the verdict unless ``quiet``.
    The run's own comparison records the digests of the eval markers it read (:func:`evaluated`),
    so ``eyas status`` can tell when a family was evaluated again since."""
    summary = compare(reports)
    if name is None:
        summary["evaluated"] = evaluated(config)
    write_json_atomic(families_file(config, name), summary)
    if not quiet:
        console.print(families_table(summary))
        console.print(summary["verdict"])
    return summary


def evaluated(config: RunConfig) -> dict[str, str | None]:
    """Each family's eval marker digest as it is now (None where it has none)."""
    markers = {view.train.drafter: read_marker(RunPaths.of(view).marker("eval")) for view in config.drafter_views()}
    return {family: digest(m) if m is not None else None for family, m in markers.items()}


def families_state(config: RunConfig) -> StageState | None:
    """``families.json`` beside the families' evals, for ``eyas status``: current only when it
    compared the evaluations on disk now. None for a run of one family."""
    if len(config.drafter_views()) < 2:
        return None
    path = families_file(config)
    if not path.is_file():
        return StageState("families", "missing", [f"{path.name} does not exist: not every family was evaluated"])
    recorded = json.loads(path.read_text()).get("evaluated", {})
    changed = [f for f, d in evaluated(config).items() if d is None or recorded.get(f) != d]
    if not changed:
        return StageState("families", "current")
    return StageState("families", "stale", [f"eval ({f}) was redone since the comparison" for f in changed])


def verdict(summary: dict) -> str:
    """The sentence a user acts on: which family to ship, or to ship none."""
    rows, basis, best = summary["families"], summary["basis"], summary["best"]
    measured = ", ".join(f"{f} {_speed(r['speedup'])}" for f, r in rows.items())
    if best is None:
        return f"no drafter family decoded losslessly with a measured speed: see each family's eval report ({measured})"
    if summary["faster"] is None:
        rival = max(summary["draftless"].items(), key=lambda kv: kv[1], default=None)
        beaten_by = (
            "plain decoding" if rival is None or rival[1] <= 1.0 else f"{rival[0]} ({rival[1]:.2f}×, no drafter)"
        )
        return f"ship no drafter: no family decodes faster than {beaten_by} on these prompts ({measured}); by {basis}"
    others = ", ".join(f"{f} {_speed(r['speedup'])}" for f, r in rows.items() if f != best)
    line = f"faster on these prompts: {best}, {rows[best]['speedup']:.2f}× plain speed"
    return line + (f" (against {others})" if others else "") + f"; by {basis}"


def compare(reports: dict[str, dict]) -> dict:
    """The families side by side from their eval reports (family -> report).

    ``best``: the lossless family with the highest measured speed-up (None when none has one);
    ``faster``: that family only when it beats plain decoding and every draftless method
    measured beside it (llama.cpp's n-gram speculation, or eyas's prompt lookup), else None —
    a drafter slower than what the user already has is not worth serving."""
    in_engine = all("llamacpp" in r for r in reports.values())
    vllm_only = all(family not in r["methods"] for family, r in reports.items())
    rows = {family: _row(family, report, in_engine, vllm_only) for family, report in reports.items()}
    draftless = _draftless(reports.values(), in_engine, vllm_only)
    measured = [f for f, row in rows.items() if row["lossless"] and row["speedup"] is not None]
    best = max(measured, key=lambda f: rows[f]["speedup"]) if measured else None
    worth = best is not None and rows[best]["speedup"] > max([1.0, *draftless.values()])
    summary = {
        "basis": ENGINE_BASIS if in_engine else VLLM_BASIS if vllm_only else IN_PROCESS_BASIS,
        "prompts": next(iter(reports.values()))["prompts"],
        "best": best,
        "faster": best if worth else None,
        "draftless": draftless,
        "families": rows,
    }
    summary["verdict"] = verdict(summary)
    return summary


def _draftless(reports, in_engine: bool, vllm_only: bool) -> dict[str, float]:
    """The speed-ups of the speculation that needs no drafter, measured in the same basis as the
    families (the best of the families' evaluations, since each measured them in its own rounds)."""
    found: dict[str, float] = {}
    for report in reports:
        if in_engine:
            rows = {n: m for n, m in report["llamacpp"]["methods"].items() if n in NGRAM_TYPES}
        elif vllm_only:
            rows = {}
        else:
            rows = {n: m for n, m in report["methods"].items() if n == PromptLookup.name}
        for name, row in rows.items():
            if row.get("speedup") is not None:
                found[name] = max(found.get(name, 0.0), row["speedup"])
    return found


def _speed(speedup: float | None) -> str:
    return f"{speedup:.2f}×" if speedup is not None else "not measured"


def _row(family: str, report: dict, in_engine: bool, vllm_only: bool) -> dict:
    """A family's figures from its report: eyas's own row, or vLLM's where only vLLM ran the target."""
    own = report["methods"][method_name(family) if vllm_only else family]
    row = {
        "tau": own["tau"],
        "per_position": own["per_position"],
        "speedup": own.get("speedup"),
        "lossless": not any(_is_own(method, family) for method in lossless_failures(report)),
        "draft": report["draft"],
    }
    if in_engine:
        section = report["llamacpp"]
        best = section["methods"][section["best_draft"]]
        row |= {"speedup": best.get("speedup"), "best_draft": section["best_draft"], "llamacpp_tau": best["tau"]}
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
        speed = _speed(row["speedup"])
        t.add_row(
            family + (" (faster)" if family == summary["faster"] else ""),
            f"{row['tau']:.2f}",
            *[f"{a:.2f}" for a in row["per_position"]],
            speed + (f" ({row['best_draft']})" if "best_draft" in row else ""),
            "yes" if row["lossless"] else "NO",
        )
    t.caption = f"speed-up: {summary['basis']}"
    return t
