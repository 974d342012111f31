"""Warm start (``train.init_from``): begin from a drafter already trained for this target.

Any drafter eyas reads (:func:`eyas.drafter.families.read_drafter`: its own checkpoints and
exports, SpecForge/SGLang, vLLM/speculators) can seed a run when it has this run's shape: the
same target hidden size and vocabulary, the same aux layers, the same layer sizes. Every weight
is copied except ``lm_head``, whose rows follow the draft vocabulary.

The draft vocabulary is this run's own, counted from its training split as for a run from
scratch, not the source's: a warm start is how a drafter moves to new data (a code corpus after
a chat one), and the tokens it must predict are the new data's. The ``lm_head`` row of every id
both vocabularies hold is carried over, so nothing learned about a shared token is lost; ids new
to this run start from the fresh initialisation. On the same kind of data nearly every row carries.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from eyas.config import ConfigError
from eyas.drafter.families import family_of, read_drafter
from eyas.drafter.spec import DrafterSpec

log = logging.getLogger(__name__)

SHAPE_FIELDS = (
    "vocab_size",
    "target_hidden_size",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "aux_layers",
)
"""What must match for the source's weights to fit (the draft vocabulary size need not)."""

FIX = {
    "aux_layers": "set extract.aux_layers to the source's",
    "intermediate_size": "set train.intermediate_size to the source's",
    "num_attention_heads": "set train.num_attention_heads to the source's",
    "num_key_value_heads": "set train.num_key_value_heads to the source's",
}


def warm_start(drafter: nn.Module, source: Path, target_layers: int) -> dict:
    """Copy ``source``'s weights into ``drafter`` (a family with a reduced vocabulary —
    ``lm_head``, ``d2t``, ``t2d`` — already set); returns
    how many ``lm_head`` rows were carried over and how many start fresh."""
    try:
        spec, weights = read_drafter(source, target_layers)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(f"train.init_from: {e}") from None
    check_shape(spec, drafter.spec, source)
    head, carried = carry_rows(drafter, spec, weights)
    weights = {**weights, "lm_head.weight": head, "d2t": drafter.d2t, "t2d": drafter.t2d}
    try:
        drafter.load_weights(weights, f"train.init_from: {source}")
    except (RuntimeError, ValueError) as e:
        raise ConfigError(str(e)) from None
    fresh = drafter.spec.draft_vocab_size - carried
    log.info("warm start from %s: %d lm_head rows carried over, %d new to this vocabulary", source, carried, fresh)
    return {"carried_rows": carried, "new_rows": fresh}


def check_shape(source: DrafterSpec, wanted: DrafterSpec, where: Path) -> None:
    if source.family != wanted.family:
        raise ConfigError(
            f"train.init_from: {where} holds a {family_of(source).title} drafter; this run trains {family_of(wanted).title}"
        )
    differ = [f for f in SHAPE_FIELDS if getattr(source, f) != getattr(wanted, f)]
    if differ:
        detail = "; ".join(
            f"{f} {getattr(source, f)} there, {getattr(wanted, f)} here" + (f" ({FIX[f]})" if f in FIX else "")
            for f in differ
        )
        raise ConfigError(f"train.init_from: {where} is a drafter of another shape: {detail}")


def carry_rows(drafter: nn.Module, spec: DrafterSpec, weights: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """This run's ``lm_head``: the source's row for every target id both draft vocabularies hold,
    the drafter's fresh row for the rest."""
    source_d2t = weights.get("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long))
    source_ids = torch.arange(spec.draft_vocab_size) + source_d2t.long()
    row_of = torch.full((spec.vocab_size,), -1, dtype=torch.long)
    row_of[source_ids] = torch.arange(spec.draft_vocab_size)
    target_ids = drafter.to_target_ids(torch.arange(drafter.spec.draft_vocab_size, device=drafter.d2t.device)).cpu()
    rows = row_of[target_ids]
    shared = rows >= 0
    head = drafter.lm_head.weight.detach().cpu().clone()
    head[shared] = weights["lm_head.weight"].to(head.dtype)[rows[shared]]
    return head, int(shared.sum())
