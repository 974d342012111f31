"""EAGLE-3 proposer: a drafter behind the loop's :class:`~eyas.speculate.decode.Proposer`.

The drafter keeps its own KV cache in a :class:`~eyas.drafter.session.DraftSession`; the loop
hands it the target's aux states at each committed position, as SGLang and vLLM do after
every verification pass. ``aux_order`` permutes the three aux layers before the drafter sees
them: ``(2, 1, 0)`` is the broken control — the reference job's concatenation bug — whose τ
must collapse toward 1 if the drafter really uses what it was trained on.

At temperature > 0 vLLM drafts the drafter's argmax and accepts it with the target's
probability of it (q one-hot); that is the default here too (``eval.draft_sampling: greedy``),
so the τ eyas reports is the one a server shows. ``sample`` draws drafts from the drafter's
own distribution and accepts with min(1, p/q), which usually accepts more.
"""

from __future__ import annotations

import torch

BROKEN_ORDER = (2, 1, 0)


class EagleProposer:
    """Implements the Proposer protocol with an :class:`~eyas.drafter.model.Eagle3Drafter`."""

    def __init__(
        self, drafter, name: str = "eagle3", aux_order: tuple[int, ...] | None = None, sample_drafts: bool = False
    ):
        self.drafter = drafter
        self.sample_drafts = sample_drafts
        self.name = name
        self.aux_layers = list(drafter.spec.aux_layers)
        if aux_order is not None and sorted(aux_order) != list(range(len(self.aux_layers))):
            raise ValueError(f"aux_order {aux_order} is not a permutation of the {len(self.aux_layers)} aux layers")
        self.aux_order = aux_order
        self.session = None

    def reset(self, prompt_ids: list[int]) -> None:
        from eyas.drafter.session import DraftSession

        self.session = DraftSession(self.drafter)

    def append(self, aux: torch.Tensor | None, next_tokens: list[int]) -> None:
        if self.aux_order is not None:
            parts = aux.chunk(len(self.aux_layers), dim=-1)
            aux = torch.cat([parts[i] for i in self.aux_order], dim=-1)
        self.session.append(aux, torch.tensor(next_tokens, dtype=torch.long, device=aux.device))

    @torch.inference_mode()
    def propose(self, k: int, temperature: float = 0.0) -> tuple[list[int], list[torch.Tensor] | None]:
        """Drafts, with their distributions only when sampled (None tells verification q is one-hot)."""
        return self.session.propose(k, temperature if self.sample_drafts else 0.0)
