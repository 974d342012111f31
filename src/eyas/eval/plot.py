"""``acceptance.png``: per-position acceptance of each method, τ per dataset, and — when the
drafter was served in llama.cpp — its decode speed-up there beside llama.cpp's n-gram speculation.

Drawn with matplotlib's non-interactive Agg backend so it works on a headless box.
"""

from __future__ import annotations

from pathlib import Path

from eyas.eval.llamacpp_engine import is_drafted
from eyas.figures import save, subplots


def plot_acceptance(report: dict, path: Path) -> Path:
    methods = report["methods"]
    k = report["config"]["num_draft_tokens"]
    datasets = sorted({d for m in methods.values() for d in m["tau_per_dataset"]})
    llamacpp = report.get("llamacpp")
    fig, axes = subplots(1, 3 if llamacpp else 2, figsize=(16.5 if llamacpp else 11, 4.2))
    left, right = axes[0], axes[1]
    width = 0.8 / max(len(methods), 1)
    # A serving engine's counters are pooled over all prompts: it has no per-dataset bars.
    per_dataset = {name: m for name, m in methods.items() if m["tau_per_dataset"]}
    for j, (name, m) in enumerate(methods.items()):
        xs = [i + 1 + (j - (len(methods) - 1) / 2) * width for i in range(k)]
        left.bar(xs, m["per_position"], width, label=f"{name} (τ {m['tau']:.2f})")
    right_width = 0.8 / max(len(per_dataset), 1)
    for j, (name, m) in enumerate(per_dataset.items()):
        xs = [i + (j - (len(per_dataset) - 1) / 2) * right_width for i in range(len(datasets))]
        right.bar(xs, [m["tau_per_dataset"].get(d, 0.0) for d in datasets], right_width, label=name)
    left.set(
        title="acceptance rate by draft position", xlabel="draft position", ylabel="accepted / rounds", ylim=(0, 1)
    )
    left.set_xticks(range(1, k + 1))
    left.legend(fontsize=8)
    right.set(title="acceptance length τ by dataset", ylabel="tokens per target pass")
    right.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    right.set_xticks(range(len(datasets)), datasets, rotation=20)
    if per_dataset:
        right.legend(fontsize=8)
    if llamacpp:
        names = list(llamacpp["methods"])
        speedups = [llamacpp["methods"][n]["speedup"] for n in names]
        axes[2].bar(range(len(names)), speedups, color=["C0" if is_drafted(n) else "C7" for n in names])
        axes[2].axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        axes[2].set_xticks(range(len(names)), names, rotation=20)
        axes[2].set(
            title=f"llama.cpp decode speed vs plain ({llamacpp['plain']['tokens_per_s']:.0f} tok/s)", ylabel="speed-up"
        )
    fig.suptitle(f"{report['prompts']} prompts, {k} draft tokens, temperature {report['config']['temperature']}")
    return save(fig, path)
