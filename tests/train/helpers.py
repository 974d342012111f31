"""Small drafters on the embedded target for train and export tests."""

from __future__ import annotations

import torch

from eyas.config import TrainConfig
from eyas.drafter.families.eagle3 import Eagle3Drafter, Eagle3Spec
from eyas.drafter.spec import spec_for_target
from eyas.target.capture import default_aux_layers, num_decoder_layers


def small_drafter(model, draft_vocab_size: int = 512, seed: int = 0, **sizes) -> Eagle3Drafter:
    """A randomly initialised drafter with the target's hidden size and a small MLP and vocabulary."""
    torch.manual_seed(seed)
    train = TrainConfig(intermediate_size=sizes.pop("intermediate_size", 256), **sizes)
    base = spec_for_target(model.config, train, default_aux_layers(num_decoder_layers(model)), draft_vocab_size)
    spec = Eagle3Spec(**base.sizes(), **train.eagle3.model_dump())
    drafter = Eagle3Drafter(spec, model.get_input_embeddings().weight)
    used = (
        torch.randperm(spec.vocab_size, generator=torch.Generator().manual_seed(seed))[:draft_vocab_size].sort().values
    )
    t2d = torch.zeros(spec.vocab_size, dtype=torch.bool)
    t2d[used] = True
    drafter.set_vocab(used - torch.arange(draft_vocab_size), t2d)
    # Spread the random init so the per-step outputs differ visibly between positions.
    with torch.no_grad():
        for p in drafter.parameters():
            if p.requires_grad and p.ndim == 2:
                p.mul_(3.0)
    return drafter.eval()
