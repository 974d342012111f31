"""Eval metrics, ``<run_dir>/eval/report.json`` and the printed table.

Per method: acceptance length τ (committed tokens ÷ verification passes, pooled over prompts
so long answers weigh by their length, as a serving engine's counters would), per-position
acceptance (rounds whose i-th draft was accepted ÷ rounds), τ per dataset, tokens/s and the
speed-up over plain greedy decoding, and the lossless check: with greedy verification every
prompt's output must equal plain greedy decoding of the target, token for token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from eyas.files import write_json_atomic

PLAIN = "plain"


@dataclass
class PromptResult:
    prompt_id: str
    dataset: str
    tokens: list[int]
    passes: int
    seconds: float
    accepted_at: list[int] = field(default_factory=list)


def summarize(
    results: list[PromptResult], k: int, reference: dict[str, list[int]] | None, plain_tps: float | None
) -> dict:
    """One method's figures; ``reference`` maps prompt id to the plain greedy output (None: sampling)."""
    generated = sum(len(r.tokens) - 1 for r in results)
    passes = sum(r.passes for r in results)
    tokens = sum(len(r.tokens) for r in results)
    seconds = sum(r.seconds for r in results)
    per_dataset: dict[str, list[int]] = {}
    for r in results:
        acc = per_dataset.setdefault(r.dataset, [0, 0])
        acc[0] += len(r.tokens) - 1
        acc[1] += r.passes
    tps = tokens / seconds if seconds else 0.0
    summary = {
        "prompts": len(results),
        "tokens": tokens,
        "target_passes": passes,
        "tau": generated / passes if passes else 1.0,
        "per_position": [
            sum(r.accepted_at[i] for r in results if r.accepted_at) / passes if passes else 0.0 for i in range(k)
        ],
        "tau_per_dataset": {d: g / p if p else 1.0 for d, (g, p) in sorted(per_dataset.items())},
        "tau_per_prompt": {r.prompt_id: (len(r.tokens) - 1) / r.passes if r.passes else 1.0 for r in results},
        "seconds": seconds,
        "tokens_per_s": tps,
        "speedup": tps / plain_tps if plain_tps else None,
    }
    if reference is not None:
        mismatched = [r.prompt_id for r in results if r.tokens != reference[r.prompt_id]]
        summary["lossless"] = {
            "checked": len(results),
            "identical": len(results) - len(mismatched),
            "mismatched": mismatched,
        }
    return summary


def plain_summary(results: list[PromptResult]) -> dict:
    tokens = sum(len(r.tokens) for r in results)
    seconds = sum(r.seconds for r in results)
    return {
        "prompts": len(results),
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
    }


def report_frame(config, draft_dir: Path, prompts: list, plain: dict, methods: dict[str, dict]) -> dict:
    """``report.json``'s shape, whoever ran the methods: the settings, the plain baseline, each method."""
    return {
        "config": config.eval.model_dump(mode="json"),
        "target": config.target.model,
        "draft": str(draft_dir),
        "prompts": len(prompts),
        "datasets": sorted({p.dataset for p in prompts}),
        "plain": plain,
        "methods": methods,
    }


def lossless_failures(report: dict) -> dict[str, list[str]]:
    """Methods whose output differed from plain greedy decoding (in llama.cpp: from its own plain
    decoding), with the prompt ids."""
    methods = dict(report["methods"])
    methods |= {f"{name} (llama.cpp)": m for name, m in report.get("llamacpp", {}).get("methods", {}).items()}
    return {name: m["lossless"]["mismatched"] for name, m in methods.items() if m.get("lossless", {}).get("mismatched")}


def engine_failures(report: dict) -> list[str]:
    """Where a serving engine that ran the export disagrees with eyas (see :mod:`eyas.eval.vllm_engine`)."""
    return list(report.get("engine_check", {}).get("problems", []))


def engine_check_line(report: dict) -> str | None:
    """One line under the table: does the serving engine's τ agree with eyas's?"""
    check = report.get("engine_check")
    if check is None:
        return None
    figures = (
        f"vLLM τ {check['vllm_tau']:.3f} vs eyas {check['eyas_tau']:.3f} ({check['difference']:+.3f}), "
        f"passes {check['vllm_drafts']} vs {check['eyas_passes']}"
    )
    if not check["checked"]:
        return f"{figures}: not checked at temperature > 0 (the engines draw different random numbers)"
    return f"{figures}: " + (
        "agree" if not check["problems"] else f"DISAGREE ({len(check['problems'])} problems, below)"
    )


def write_report(path: Path, report: dict) -> None:
    write_json_atomic(path, report)


def table(report: dict) -> Table:
    k = report["config"]["num_draft_tokens"]
    t = Table(title=f"speculative decoding, {k} draft tokens, {report['prompts']} prompts")
    t.add_column("method")
    t.add_column("τ", justify="right")
    # With several source datasets, each one's τ on its own held-out prompts beside the overall one.
    datasets = report["datasets"] if len(report["datasets"]) > 1 else []
    for d in datasets:
        t.add_column(f"τ {d}", justify="right")
    for i in range(k):
        t.add_column(f"acc@{i + 1}", justify="right")
    t.add_column("tok/s", justify="right")
    t.add_column("speed-up", justify="right")
    t.add_column("lossless", justify="right")
    plain = report["plain"]
    blank = ["" for _ in range(len(datasets) + k)]
    t.add_row(PLAIN, "1.00", *blank, f"{plain['tokens_per_s']:.1f}", "1.00×", "reference")
    for name, m in report["methods"].items():
        lossless = m.get("lossless")
        check = f"{lossless['identical']}/{lossless['checked']}" if lossless else "n/a (sampling)"
        per_dataset = m["tau_per_dataset"]
        t.add_row(
            name,
            f"{m['tau']:.2f}",
            *[f"{per_dataset[d]:.2f}" if d in per_dataset else "" for d in datasets],
            *[f"{r:.2f}" for r in m["per_position"]],
            f"{m['tokens_per_s']:.1f}",
            f"{m['speedup']:.2f}×" if m["speedup"] else "",
            check,
        )
    return t


def llamacpp_table(section: dict) -> Table:
    """Decode speed in llama.cpp, each configuration beside plain decoding (medians over rounds)."""
    t = Table(title=f"llama.cpp decode speed, median of {section['repeats']} rounds")
    for col in ("configuration", "τ", "tok/s", "speed-up", "lossless"):
        t.add_column(col, justify="left" if col == "configuration" else "right")
    t.add_row(PLAIN, "1.00", f"{section['plain']['tokens_per_s']:.1f}", "1.00×", "reference")
    for name, m in section["methods"].items():
        best = " (best draft)" if name == section["best_draft"] else ""
        t.add_row(
            name + best,
            f"{m['tau']:.2f}",
            f"{m['tokens_per_s']:.1f}",
            f"{m['speedup']:.2f}×",
            _llamacpp_lossless(m["lossless"]),
        )
    return t


def _llamacpp_lossless(check: dict) -> str:
    """``identical/checked``, and how many more departed only at a float tie (the largest margin)."""
    cell = f"{check['identical']}/{check['checked']}"
    ties = check.get("float_ties", [])
    if ties:
        cell += f" +{len(ties)} at ties ≤ {max(t['margin'] for t in ties):.4f}"
    return cell


def llamacpp_summary(section: dict) -> str:
    """The sentence a newcomer reads: what the drafter does to llama.cpp's speed, and n-grams'."""
    best = section["methods"][section["best_draft"]]
    ngram = section["methods"].get("ngram-mod")
    line = f"in llama.cpp the drafter decodes at {best['speedup']:.2f}× plain speed ({section['best_draft']})"
    return line + (f"; llama.cpp's ngram-mod at {ngram['speedup']:.2f}×" if ngram else "")
