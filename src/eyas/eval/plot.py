"""``acceptance.png``: per-position acceptance of each method, and τ per dataset.

Drawn with matplotlib's non-interactive Agg backend so it works on a headless box.
"""

from __future__ import annotations

from pathlib import Path


def plot_acceptance(report: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = report["methods"]
    k = report["config"]["num_draft_tokens"]
    datasets = sorted({d for m in methods.values() for d in m["tau_per_dataset"]})
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
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
    right.legend(fontsize=8)
    fig.suptitle(f"{report['prompts']} prompts, {k} draft tokens, temperature {report['config']['temperature']}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
