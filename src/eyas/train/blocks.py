"""The DFlash objective: blocks anchored at random answer positions, scored per block position.

Each sample gets up to ``train.dflash.anchors`` blocks, anchored (the block's committed token)
at positions a drawn without replacement from those whose next token is an answer token; each
sample's draw comes from a generator seeded by the step and the sample's index, so a resumed run
draws the same blocks and N data-parallel ranks draw what one process would. Block
position k predicts the token at a+k against the target's own distribution there (soft
cross-entropy, as EAGLE-3's loss in :mod:`eyas.train.loss`); a position past the sample's end
or outside the answer carries no loss, and a sample with fewer candidates than anchors gets
empty blocks, masked out.

Accuracy is kept the way serving accepts a block: position k is *scored* only when positions
1..k-1 all matched the target's greedy token, and *correct* when it matches too. So accuracy k
is the chance draft k is accepted given the earlier ones were, and the simulated acceptance
length 1 + Σₖ Πᵢ≤ₖ accᵢ that EAGLE-3's evaluation reports is exact for these blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from eyas.train.loss import StepStats


def sample_anchors(loss_mask: torch.Tensor, count: int, seeds: list[int]) -> torch.Tensor:
    """[B,count] anchor positions (−1: no block): positions a whose token a+1 is an answer token,
    row r's drawn with seed ``seeds[r]``."""
    candidates = F.pad(loss_mask[:, 1:], (0, 1), value=False).cpu()
    anchors = torch.full((loss_mask.shape[0], count), -1, dtype=torch.long)
    for row, (allowed, seed) in enumerate(zip(candidates, seeds)):
        where = allowed.nonzero().flatten()
        generator = torch.Generator().manual_seed(seed)
        picked = where[torch.randperm(where.numel(), generator=generator)[:count]]
        anchors[row, : picked.numel()] = picked.sort().values
    return anchors.to(loss_mask.device)


def decay_weights(block_size: int, gamma: float) -> list[float]:
    """exp(−(k−1)/γ) for block positions k = 1..block_size−1."""
    return [math.exp(-(k - 1) / gamma) for k in range(1, block_size)]


@dataclass
class BlockObjective:
    """What :func:`eyas.train.loop.train_step` and evaluation ask of a DFlash drafter."""

    anchors: int
    block_size: int

    @property
    def positions(self) -> int:
        return self.block_size - 1

    def stats(self, forward, drafter, batch, seeds: list[int]) -> list[StepStats]:
        """Per block position sums over the batch; ``seeds``: one per sample, for its anchors."""
        anchors = sample_anchors(batch.loss_mask, self.anchors, seeds)
        logits = forward(batch.aux, batch.input_ids, anchors)
        b, t = batch.input_ids.shape
        where = anchors.clamp(min=0)[..., None] + torch.arange(1, self.block_size, device=anchors.device)
        inside = (anchors[..., None] >= 0) & (where < t)
        where = where.clamp(max=t - 1)
        answer = batch.loss_mask.gather(1, where.view(b, -1)).view_as(where) & inside
        with torch.no_grad():
            # The target's distribution for the token at p comes from its final state at p−1.
            final = batch.final.gather(1, (where - 1).view(b, -1, 1).expand(-1, -1, batch.final.shape[-1]))
            target_logits = (final.to(drafter.target_head.weight.dtype) @ drafter.target_head.weight.T).float()
            target_logits = target_logits.view(*where.shape, -1)
            probs = torch.softmax(target_logits, dim=-1)
            greedy = target_logits.argmax(-1)
        loss = -(probs * torch.log_softmax(logits.float(), dim=-1)).sum(-1)
        hits = (logits.argmax(-1) == greedy) & answer
        accepted_before = F.pad(hits.long().cumprod(-1), (1, 0), value=1)[..., :-1].bool()
        return [
            StepStats(
                loss_sum=(loss[..., k] * answer[..., k]).sum(),
                loss_count=answer[..., k].sum(),
                correct=(hits[..., k] & accepted_before[..., k]).sum(),
                scored=(answer[..., k] & accepted_before[..., k]).sum(),
            )
            for k in range(self.positions)
        ]
