"""A trained drafter, of any family, behind the loop's :class:`~eyas.speculate.decode.Proposer`.

The drafter keeps its own state in its family's session
(:meth:`eyas.drafter.family.Family.session`); the loop hands it the target's aux states at each
committed position, as SGLang, vLLM and llama.cpp do after every verification pass. ``aux_order``
permutes the aux layers before the drafter sees them: ``(2, 1, 0)`` is the broken control — the
reference job's concatenation bug — whose τ must collapse toward 1 if the drafter really uses
what it was trained on.

At temperature > 0 vLLM drafts the drafter's argmax and accepts it with the target's
probability of it (q one-hot); that is the default here too (``eval.draft_sampling: greedy``),
so the τ eyas reports is the one a server shows. ``sample`` draws drafts from the drafter's
own distribution, where its family can, and accepts with min(1, p/q), which usually accepts more.
"""

from __future__ import annotations

import torch

from eyas.drafter.families import family_of

BROKEN_ORDER = (2, 1, 0)


class DrafterProposer:
    """Implements the Proposer protocol with a drafter of any family."""

    def __init__(
        self, drafter, name: str | None = None, aux_order: tuple[int, ...] | None = None, sample_drafts: bool = False
    ):
        self.drafter = drafter
        self.family = family_of(drafter.spec)
        self.name = name or self.family.name
        self.sample_drafts = sample_drafts
        self.aux_layers = list(drafter.spec.aux_layers)
        if aux_order is not None and sorted(aux_order) != list(range(len(self.aux_layers))):
            raise ValueError(f"aux_order {aux_order} is not a permutation of the {len(self.aux_layers)} aux layers")
        self.aux_order = aux_order
        self.session = None

    def reset(self, prompt_ids: list[int]) -> None:
        self.session = self.family.session(self.drafter)

    def append(self, aux: torch.Tensor | None, next_tokens: list[int]) -> None:
        if self.aux_order is not None:
            parts = aux.chunk(len(self.aux_layers), dim=-1)
            aux = torch.cat([parts[i] for i in self.aux_order], dim=-1)
        self.session.append(aux, torch.tensor(next_tokens, dtype=torch.long, device=aux.device))

    @torch.inference_mode()
    def propose(self, k: int, temperature: float = 0.0) -> tuple[list[int], list[torch.Tensor] | None]:
        """Drafts, with their distributions only when sampled (None tells verification q is one-hot)."""
        return self.session.propose(k, temperature if self.sample_drafts else 0.0)


def broken_control(drafter, sample_drafts: bool = False) -> DrafterProposer | None:
    """The control that feeds the aux layers in the wrong order, for a family that has one."""
    family = family_of(drafter.spec)
    if not family.broken_control:
        return None
    return DrafterProposer(drafter, broken_control_name(family.name), BROKEN_ORDER, sample_drafts)


def broken_control_name(family: str) -> str:
    """The row the control of :func:`broken_control` has in eval's report, for the family named ``family``."""
    return f"{family}_broken_aux_order"
