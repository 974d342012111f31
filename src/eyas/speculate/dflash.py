"""DFlash proposer: a block-diffusion drafter behind the loop's :class:`~eyas.speculate.decode.Proposer`.

The loop hands it the target's context-feature states at each committed position, as
llama.cpp's ``draft-dflash`` injects them after every verification pass; each proposal is one
forward pass of the block ``[last committed token, mask, …]``. Drafts are the drafter's argmax
(verification treats them as one-hot proposals, as engines do for DFlash).
"""

from __future__ import annotations

import torch


class DFlashProposer:
    """Implements the Proposer protocol with a :class:`~eyas.drafter.dflash.DFlashDrafter`."""

    def __init__(self, drafter, name: str = "dflash"):
        self.drafter = drafter
        self.name = name
        self.aux_layers = list(drafter.spec.aux_layers)
        self.session = None

    def reset(self, prompt_ids: list[int]) -> None:
        from eyas.drafter.dflash import DFlashSession

        self.session = DFlashSession(self.drafter)

    def append(self, aux: torch.Tensor | None, next_tokens: list[int]) -> None:
        self.session.append(aux, torch.tensor(next_tokens, dtype=torch.long))

    @torch.inference_mode()
    def propose(self, k: int, temperature: float = 0.0) -> tuple[list[int], None]:
        return self.session.propose(k), None


def proposer_for(drafter, sample_drafts: bool = False):
    """The proposer that drives ``drafter``, whichever family it is."""
    from eyas.drafter.dflash import DFlashDrafter
    from eyas.speculate.eagle import EagleProposer

    return (
        DFlashProposer(drafter)
        if isinstance(drafter, DFlashDrafter)
        else EagleProposer(drafter, sample_drafts=sample_drafts)
    )
