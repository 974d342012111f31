"""Held-out evaluation during training: per-position loss, top-1 accuracy, simulated acceptance length.

The family's own objective as in training (a TTT unroll with ground-truth tokens fed at every
step, or anchored blocks), so position k's accuracy approximates the chance that draft k is
accepted once drafts 1..k-1 were; the simulated acceptance length 1 + Σₖ Πᵢ≤ₖ accᵢ follows. Each rank scores its share; one
all-reduce at the end combines them.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from eyas.drafter.loss import StepStats, acceptance_length


def totals(stats: list[StepStats]) -> torch.Tensor:
    """[4, steps]: loss sums, loss counts, hits, scored positions (detached, float64)."""
    return torch.stack(
        [
            torch.stack([getattr(s, f).detach().double() for s in stats])
            for f in ("loss_sum", "loss_count", "correct", "scored")
        ]
    )


def summarize(sums: torch.Tensor) -> dict:
    loss_sum, loss_count, correct, scored = sums.cpu()
    acc = (correct / scored.clamp(min=1)).tolist()
    return {
        "loss": (loss_sum / loss_count.clamp(min=1)).tolist(),
        "acc": acc,
        "acceptance_length": acceptance_length(acc),
        "scored": int(scored[0]),
    }


@torch.no_grad()
def evaluate(drafter, source, objective, batch_size: int, world, autocast) -> dict:
    was_training = drafter.training
    drafter.eval()
    # Length-sorted batches waste the least compute on padding; the sums do not depend on order.
    lengths = source.lengths()
    mine = sorted(range(world.rank, len(source), world.size), key=lambda i: lengths[i])
    batches = [mine[i : i + batch_size] for i in range(0, len(mine), batch_size)]
    # Every rank runs the same number of forwards (FSDP gathers weights collectively in each):
    # a rank with fewer batches scores a repeat of sample 0 with its loss mask cleared.
    for _ in range(len(batches), math.ceil(math.ceil(len(source) / world.size) / batch_size)):
        batches.append(None)
    sums = torch.zeros(4, objective.positions, dtype=torch.float64, device=world.device)
    for indices in batches:
        batch = source.batch(indices or [0])
        if indices is None:
            batch = replace(batch, loss_mask=torch.zeros_like(batch.loss_mask))
        with autocast():
            # Draws (block anchors) are seeded by the sample: the same ones at every evaluation.
            sums += totals(objective.stats(drafter, drafter, batch, indices or [0]))
    drafter.train(was_training)
    return {**summarize(world.sum(sums)), "samples": len(source)}
