"""Measured acceptance during training, and the drafter kept for it.

Training's own held-out figures (:mod:`eyas.train.evaluate`) feed the true tokens at every
TTT step; what a server gets is τ over the drafter's own drafts. Every ``train.eval_every``
steps and at the end, the drafter as it stands decodes the first ``train.tau_prompts`` prompts
of the merge's eval split with the target, greedy, in the speculative loop eval uses, asking for
``train.tau_draft_tokens`` draft tokens a pass (the length you will serve; a DFlash drafter
drafts at most its block size − 1 of them, :meth:`~eyas.drafter.spec.DrafterSpec.draft_length`),
``train.tau_new_tokens`` tokens each.

A run that overfits scores worse late than early, and the last step is not the one to serve:
the drafter with the highest τ so far is kept in ``train/best/`` (written only when it is
beaten, with ``best.json``: step and τ) and becomes ``train/final``.

The measurement runs on rank 0 on the full weights (gathered from every rank, as for a
checkpoint, so FSDP shards too); the other ranks wait for it.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from eyas.drafter.families import new_drafter
from eyas.speculate.decode import TargetRunner, speculative_decode
from eyas.speculate.drafter import DrafterProposer

log = logging.getLogger(__name__)

BEST_FILE = "best.json"


@dataclass(frozen=True)
class HeldOutDecoding:
    """What one τ measurement decodes, and with which target."""

    model: torch.nn.Module
    prompts: list[list[int]]
    draft_tokens: int
    new_tokens: int
    stop_ids: set[int]

    @torch.inference_mode()
    def measure(self, drafter) -> dict:
        """τ (generated tokens ÷ verification passes, pooled over prompts) and the share of passes
        that accepted the draft at each position, as eval reports them; ``per_prompt``, each
        prompt's [generated tokens, passes], is what a paired comparison of two drafters reads."""
        started = time.perf_counter()
        per_prompt, accepted = [], [0] * self.draft_tokens
        with TargetRunner(self.model, list(drafter.spec.aux_layers)) as runner:
            proposer = DrafterProposer(drafter)
            for prompt in self.prompts:
                out = speculative_decode(runner, proposer, prompt, self.draft_tokens, self.new_tokens, self.stop_ids)
                per_prompt.append([len(out.tokens) - 1, out.passes])
                accepted = [a + b for a, b in zip(accepted, out.accepted_at)]
        generated, passes = sum(g for g, _ in per_prompt), sum(p for _, p in per_prompt)
        return {
            "tau": generated / passes if passes else 1.0,
            "per_position": [a / passes if passes else 0.0 for a in accepted],
            "per_prompt": per_prompt,
            "prompts": len(self.prompts),
            "seconds": time.perf_counter() - started,
        }


def unsharded_copy(drafter, weights: dict[str, torch.Tensor], model: torch.nn.Module):
    """A plain drafter of the same family holding ``weights`` (full tensors) on the target's
    device, for decoding outside the training wrappers."""
    embedding = model.get_input_embeddings().weight
    copy = new_drafter(drafter.spec, embedding, model.get_output_embeddings().weight)
    copy.load_weights(weights, "the drafter in training")
    return copy.to(embedding.device).eval()


def read_best(best_dir: Path) -> dict | None:
    """``{"step", "tau"}`` of the drafter kept in ``best_dir``, or None."""
    file = best_dir / BEST_FILE
    return json.loads(file.read_text()) if file.is_file() else None


def forget_later_than(best_dir: Path, step: int) -> dict | None:
    """On resume from ``step``: a best measured after it is removed (the resumed run measures
    that step again, bit for bit); what remains is returned."""
    best = read_best(best_dir)
    if best is not None and best["step"] > step:
        shutil.rmtree(best_dir)
        return None
    return best
