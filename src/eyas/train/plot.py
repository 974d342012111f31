"""``train/training.png``: loss, accuracy and acceptance against optimizer steps.

Three panels from ``metrics.jsonl``: the first draft's loss and top-1 accuracy on training
batches and on the eval split, and acceptance — the simulated length from the eval split beside τ
measured by speculative decoding on held-out prompts, with the step kept as ``train/final``
marked. Drawn with matplotlib's Agg backend so it works on a headless box.
"""

from __future__ import annotations

from pathlib import Path

from eyas.figures import save, subplots
from eyas.train.metrics import read_metrics


def plot_training(metrics: Path, path: Path, selected_step: int | None) -> Path:
    train, held_out, tau = (read_metrics(metrics, split) for split in ("train", "eval", "tau"))
    fig, (loss, acc, accept) = subplots(1, 3, figsize=(15, 4))
    for rows, label, style in ((train, "train", "-"), (held_out, "eval split", "o-")):
        steps = [r["step"] for r in rows]
        if rows:
            first = [(r["loss_steps"] if "loss_steps" in r else r["loss"])[0] for r in rows]
            loss.plot(steps, first, style, label=label)
            acc.plot(steps, [r["acc"][0] for r in rows], style, label=label)
    if held_out:
        accept.plot(
            [r["step"] for r in held_out],
            [r["acceptance_length"] for r in held_out],
            "o-",
            label="simulated (eval split)",
        )
    if tau:
        accept.plot([r["step"] for r in tau], [r["tau"] for r in tau], "s-", label="τ, speculative decoding")
    if selected_step is not None:
        accept.axvline(selected_step, color="grey", linestyle="--", label=f"train/final (step {selected_step})")
    for ax, title in ((loss, "loss, first draft"), (acc, "top-1 accuracy, first draft"), (accept, "acceptance length")):
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    return save(fig, path)
