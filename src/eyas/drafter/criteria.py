"""What a drafter is trained to minimise at each drafted position, and how the positions weigh.

Every family scores a drafted position the same way: the target's distribution there, ``p`` (as
log-probabilities, over the draft vocabulary the drafter predicts), against the drafter's logits,
``q`` after a softmax. ``train.loss`` picks the divergence, or a weighted sum of several:

- ``kl_div``: KL(p‖q), mass-covering; its gradient is that of the soft cross-entropy every
  trainer started with (the target's entropy, a constant, is what makes a perfect drafter score 0);
- ``rkl``: KL(q‖p), mode-seeking;
- ``jsd``: Jensen-Shannon, symmetric and bounded by log 2;
- ``tv``: total variation, 1 − α with α = Σ min(p, q) the probability that speculative sampling
  accepts a draft, so it optimises acceptance itself, with a gradient that vanishes while α is small;
- ``nla``: −log α, the same optimum with the gradient divided by α (the LK paper's first loss);
- ``lk_hybrid``: λ·KL + (1 − λ)·TV with λ = exp(−η·α) and α not differentiated: KL's strong pull
  while the drafter is far off, acceptance itself once it is close (the LK paper's second loss,
  Samarin et al. 2026, arXiv 2602.23881);
- ``ce``: −log q at the target's greedy token, the token greedy verification accepts.

``train.position_weighting: dpace`` replaces a family's fixed per-position decay by D-PACE's: a
position weighs what it adds to the expected acceptance length, the sum over it and the positions
after it of the chance that the whole chain up to there is accepted, from the drafter's own
(smoothed) confidence in the target's greedy token. The weights are recomputed every step and not
differentiated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from eyas.config import TrainConfig

ACCEPTANCE_FLOOR = 1e-5
"""``nla``: α is clamped here, so a drafter with no overlap yet has a finite loss."""


def _kl(target_logp: Tensor, logq: Tensor) -> Tensor:
    return (target_logp.exp() * (target_logp - logq)).sum(-1)


def _acceptance(target_logp: Tensor, logq: Tensor) -> Tensor:
    """α = Σ min(p, q): the chance speculative sampling accepts a draft from q against p."""
    return torch.minimum(target_logp.exp(), logq.exp()).sum(-1)


def kl_div(target_logp: Tensor, logq: Tensor, eta: float) -> Tensor:
    return _kl(target_logp, logq)


def rkl(target_logp: Tensor, logq: Tensor, eta: float) -> Tensor:
    return _kl(logq, target_logp)


def jsd(target_logp: Tensor, logq: Tensor, eta: float) -> Tensor:
    mixture = torch.logaddexp(target_logp, logq) - math.log(2.0)
    return 0.5 * (_kl(target_logp, mixture) + _kl(logq, mixture))


def tv(target_logp: Tensor, logq: Tensor, eta: float) -> Tensor:
    return 1.0 - _acceptance(target_logp, logq)


def nla(target_logp: Tensor, logq: Tensor, eta: float) -> Tensor:
    return -_acceptance(target_logp, logq).clamp(min=ACCEPTANCE_FLOOR).log()


def lk_hybrid(target_logp: Tensor, logq: Tensor, eta: float) -> Tensor:
    alpha = _acceptance(target_logp, logq)
    blend = torch.exp(-eta * alpha.detach())
    return blend * _kl(target_logp, logq) + (1.0 - blend) * (1.0 - alpha)


def ce(target_logp: Tensor, logq: Tensor, eta: float) -> Tensor:
    return -logq.gather(-1, target_logp.argmax(-1, keepdim=True)).squeeze(-1)


DIVERGENCES: dict[str, Callable[[Tensor, Tensor, float], Tensor]] = {
    "kl_div": kl_div,
    "rkl": rkl,
    "jsd": jsd,
    "tv": tv,
    "nla": nla,
    "lk_hybrid": lk_hybrid,
    "ce": ce,
}
"""``train.loss`` names → per-position loss of (target log-probs, drafter log-probs, η), each [...]."""


def dpace_weights(confidence: Tensor, trained: Tensor, alpha: float) -> Tensor:
    """[..., K] D-PACE's weight of each of K chained positions: Σ_{j ≥ k} Π_{i ≤ j} c̃_i over the
    trained positions, with c̃ = (1 − α)·confidence + α (1 where a position is not trained, so an
    untrained position neither weighs nor breaks the chain)."""
    mask = trained.float()
    smoothed = torch.where(trained, (1.0 - alpha) * confidence.float() + alpha, torch.ones_like(mask))
    reached = torch.cumprod(smoothed, dim=-1) * mask
    return reached.flip(-1).cumsum(-1).flip(-1) * mask


@dataclass(frozen=True)
class Criterion:
    """One run's objective per position (``train.loss``, ``lk_eta``) and its position weighting
    (``train.position_weighting``, ``dpace_alpha``)."""

    terms: tuple[tuple[str, float], ...] = (("kl_div", 1.0),)
    lk_eta: float = 3.0
    dpace_alpha: float | None = None
    """None: each family's fixed decay weighs the positions."""

    @classmethod
    def of(cls, cfg: TrainConfig) -> Criterion:
        dpace = cfg.dpace_alpha if cfg.position_weighting == "dpace" else None
        return cls(tuple(cfg.loss_terms.items()), cfg.lk_eta, dpace)

    def score(self, target_logp: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        """The loss [...] of ``logits`` [..., V] against ``target_logp`` [..., V], and the drafter's
        probability of the target's greedy token there [...] (no gradient: D-PACE's confidence)."""
        logq = torch.log_softmax(logits.float(), dim=-1)
        target_logp = target_logp.float()
        loss = sum(w * DIVERGENCES[name](target_logp, logq, self.lk_eta) for name, w in self.terms)
        greedy = logq.detach().gather(-1, target_logp.argmax(-1, keepdim=True)).squeeze(-1).exp()
        return loss, greedy

    def fixed_weights(self, decay: list[float]) -> list[float]:
        """Each position's fixed weight: the family's ``decay``, or 1 where D-PACE weighs in the loss."""
        return decay if self.dpace_alpha is None else [1.0] * len(decay)

    def weigh(self, loss: Tensor, confidence: Tensor, trained: Tensor) -> Tensor:
        """``loss`` [..., K] of K chained positions, times D-PACE's weights when chosen."""
        if self.dpace_alpha is None:
            return loss
        return loss * dpace_weights(confidence, trained, self.dpace_alpha)
