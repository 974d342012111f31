"""The two drafter families, EAGLE-3 and DFlash: building one for a run, loading either from disk.

The spec's type says the family (:class:`~eyas.drafter.dflash.DFlashSpec` or the plain
:class:`~eyas.drafter.spec.DrafterSpec`), so checkpoints, exports and eval follow it without a
separate flag.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import torch

from eyas.config import ConfigError, TrainConfig
from eyas.drafter.dflash import DFlashDrafter, DFlashSpec
from eyas.drafter.model import Eagle3Drafter
from eyas.drafter.spec import DrafterSpec


def is_dflash(spec: DrafterSpec) -> bool:
    return isinstance(spec, DFlashSpec)


def dflash_spec(base: DrafterSpec, train: TrainConfig, mask_token_id: int) -> DFlashSpec:
    """``base`` (sizes from the target and ``train.*``) as a DFlash spec over the full vocabulary."""
    sizes = {f.name: getattr(base, f.name) for f in fields(DrafterSpec)} | {"draft_vocab_size": base.vocab_size}
    if not 0 <= mask_token_id < base.vocab_size:
        raise ConfigError(f"train.dflash.mask_token_id: {mask_token_id} is outside the target's {base.vocab_size} ids")
    cfg = train.dflash
    return DFlashSpec(**sizes, num_layers=cfg.layers, block_size=cfg.block_size, mask_token_id=mask_token_id)


def default_mask_token(tokenizer, stop_ids: set[int]) -> int:
    """The tokenizer's mask token, else its highest-id special token that no sequence needs
    (not a stop, BOS or pad token): the engines embed the mask with the target's own row, and
    such a token never occurs in the text the drafter reads, so its row means nothing else."""
    if tokenizer.mask_token_id is not None:
        return int(tokenizer.mask_token_id)
    needed = stop_ids | {tokenizer.bos_token_id, tokenizer.pad_token_id}
    special = [i for i, t in tokenizer.added_tokens_decoder.items() if t.special and i not in needed]
    if not special:
        raise ConfigError(
            "train.dflash.mask_token_id: the tokenizer has no mask token and no spare special token; name one"
        )
    return max(special)


def new_drafter(spec: DrafterSpec, embedding: torch.Tensor, lm_head: torch.Tensor):
    """A drafter of the spec's family on the target's embedding (and, for DFlash, its head)."""
    return DFlashDrafter(spec, embedding, lm_head) if is_dflash(spec) else Eagle3Drafter(spec, embedding)


def load_drafter(directory: str | Path, target_model):
    """Either family's drafter from a training checkpoint, ``train/final``, an export (any
    layout) or a foreign checkpoint, on the target's device with its embedding and head."""
    from eyas.drafter.layout import CONFIG_FILE, read_drafter
    from eyas.target.capture import check_aux_layers, num_decoder_layers

    num_layers = num_decoder_layers(target_model)
    spec, weights = read_drafter(Path(directory), num_layers)
    where = f"{Path(directory) / CONFIG_FILE}: aux layers"
    check_aux_layers(list(spec.aux_layers), num_layers, where, None if is_dflash(spec) else 3)
    embedding = target_model.get_input_embeddings().weight
    drafter = new_drafter(spec, embedding, target_model.get_output_embeddings().weight)
    drafter.load_weights(weights, str(directory))
    return drafter.to(embedding.device)
