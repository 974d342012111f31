"""The optimizers a run steps (``train.optimizer``) and their learning-rate schedule.

``adamw`` is one AdamW over every trained tensor. ``muon`` is torch's own ``torch.optim.Muon``
(PyTorch ≥ 2.9) on the drafter's weight matrices, the only tensors it orthogonalises, and AdamW on
the rest (norms, biases, vectors), as speculators does since v0.7. Muon's update is scaled to the
RMS AdamW's would have (``adjust_lr_fn="match_rms_adamw"``), and its rate is ``train.muon_lr``,
by default ten times AdamW's. Every optimizer follows the same schedule: linear warmup, then
cosine to zero.

On a CPU, Muon orthogonalises in float32 (:class:`Float32Muon`): torch's runs the Newton–Schulz
iteration in bfloat16, fast on GPUs, but a CPU without bfloat16 matrix units emulates it, 74×
slower than float32 for the demo's ``lm_head`` here (21.5 s against 0.29 s an orthogonalisation).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from eyas.config import TrainConfig

MUON_LR_FACTOR = 10.0
"""Muon's rate over AdamW's when ``train.muon_lr`` is unset (speculators' default)."""
MUON_WEIGHT_DECAY = 0.1
"""Muon's decoupled weight decay (torch's and speculators' default)."""


def newton_schulz_float32(grad: torch.Tensor, ns_coefficients, ns_steps: int, eps: float) -> torch.Tensor:
    """torch's quintic Newton–Schulz orthogonalisation (same coefficients, steps and scaling to
    spectral norm ≤ 1), in float32."""
    a, b, c = ns_coefficients
    tall = grad.size(0) > grad.size(1)
    x = grad.float().T if tall else grad.float()
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


@contextmanager
def _orthogonalising_in_float32():
    from torch.optim import _muon

    torch_own = _muon._zeropower_via_newtonschulz
    _muon._zeropower_via_newtonschulz = newton_schulz_float32
    try:
        yield
    finally:
        _muon._zeropower_via_newtonschulz = torch_own


class Float32Muon(torch.optim.Muon):
    """torch's Muon with its one bfloat16 step, the orthogonalisation, in float32: for CPUs. Its
    state, settings and every other part of the update are torch's."""

    def step(self, closure=None):
        with _orthogonalising_in_float32():
            return super().step(closure)


@dataclass
class WarmupCosine:
    """LR multiplier: linear warmup over ``warmup`` steps, then cosine to zero at ``total``."""

    total: int
    warmup: int

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress_ = (step - self.warmup) / max(1, self.total - self.warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress_)))


def linear_weights(drafter: nn.Module) -> set[int]:
    """ids of the trained weight matrices of the drafter's linear layers (both sides > 1): what Muon
    updates. Lookup tables (embeddings, DSpark's Markov rows, DFlash2's codebooks), whose rows a
    batch touches a few at a time, stay with AdamW, as embeddings do in Muon's own recipe."""
    return {
        id(m.weight)
        for m in drafter.modules()
        if isinstance(m, nn.Linear) and m.weight.requires_grad and min(m.weight.shape) > 1
    }


@dataclass
class Optimizers:
    """The optimizers a step drives together, each with its schedule."""

    optimizers: list[torch.optim.Optimizer]
    schedulers: list[torch.optim.lr_scheduler.LambdaLR]

    def zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)

    def step(self) -> None:
        for optimizer, scheduler in zip(self.optimizers, self.schedulers):
            optimizer.step()
            scheduler.step()

    @property
    def lr(self) -> float:
        """The current rate of the first optimizer (Muon's under ``muon``)."""
        return self.schedulers[0].get_last_lr()[0]


def build_optimizers(drafter: nn.Module, cfg: TrainConfig, lr: float, total: int) -> Optimizers:
    """``cfg.optimizer`` over the drafter's trained tensors at peak rate ``lr`` (the family's), each
    on :class:`WarmupCosine` over ``total`` steps."""
    trained = [p for p in drafter.parameters() if p.requires_grad]
    if cfg.optimizer == "muon":
        muon = linear_weights(drafter)
        matrices = [p for p in trained if id(p) in muon]
        rest = [p for p in trained if id(p) not in muon]
        muon_lr = cfg.muon_lr if cfg.muon_lr is not None else MUON_LR_FACTOR * lr
        on_cpu = all(p.device.type == "cpu" for p in matrices)
        muon_type = Float32Muon if on_cpu else torch.optim.Muon
        optimizers = [muon_type(matrices, lr=muon_lr, weight_decay=MUON_WEIGHT_DECAY, adjust_lr_fn="match_rms_adamw")]
        if rest:
            optimizers.append(torch.optim.AdamW(rest, lr=lr, weight_decay=cfg.weight_decay))
    else:
        optimizers = [torch.optim.AdamW(trained, lr=lr, weight_decay=cfg.weight_decay)]
    warmup = round(cfg.warmup_ratio * total)
    schedulers = [torch.optim.lr_scheduler.LambdaLR(o, WarmupCosine(total, warmup)) for o in optimizers]
    return Optimizers(optimizers, schedulers)
