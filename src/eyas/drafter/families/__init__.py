"""The drafter families eyas trains, one module each, and what reads or writes any of them.

A spec's type names its family (:attr:`~eyas.drafter.spec.DrafterSpec.family`), and a drafter
directory's ``config.json`` names it by its architectures, so checkpoints, exports and eval follow
the family without a flag of their own. Adding a family is adding its module and its line in
:data:`FAMILIES`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from eyas.drafter.families.dflash import DFLASH
from eyas.drafter.families.dflash2 import DFLASH2
from eyas.drafter.families.dspark import DSPARK
from eyas.drafter.families.eagle3 import EAGLE3
from eyas.drafter.family import Family
from eyas.drafter.layout import CHECKPOINT_DTYPE, CONFIG_FILE, read_config, read_weights
from eyas.drafter.spec import DrafterSpec

FAMILIES: dict[str, Family] = {f.name: f for f in (EAGLE3, DFLASH, DSPARK, DFLASH2)}
"""By ``train.drafter`` name, in the order the config's documentation lists them."""


def family(name: str) -> Family:
    return FAMILIES[name]


def family_of(spec: DrafterSpec) -> Family:
    """The family a spec (or a drafter's ``spec``) is."""
    return FAMILIES[spec.family]


def family_in(config: dict, path: Path) -> Family:
    """The family whose layout a ``config.json`` (at ``path``) is."""
    architectures = config.get("architectures")
    for candidate in FAMILIES.values():
        if architectures in ([a] for a in candidate.architectures):
            return candidate
    known = ", ".join(f"[{a!r}]" for f in FAMILIES.values() for a in f.architectures)
    raise ValueError(f"{path}: architectures must be one of {known}")


def family_at(directory: Path) -> Family:
    """The family of the drafter in ``directory``."""
    return family_in(read_config(directory), directory / CONFIG_FILE)


def read_spec(directory: Path, target_layers: int | None = None) -> DrafterSpec:
    """The spec of a drafter in any layout a family reads, from its ``config.json`` alone (what
    an engine is asked for, such as the draft length, without loading weights); ``target_layers``
    for foreign layouts that leave the aux layers to the target's default."""
    config = read_config(directory)
    path = directory / CONFIG_FILE
    try:
        return family_in(config, path).read_spec(config, path, target_layers)
    except KeyError as e:
        raise ValueError(f"{path}: missing key {e.args[0]!r}") from None


def read_drafter(directory: Path, target_layers: int | None = None) -> tuple[DrafterSpec, dict[str, torch.Tensor]]:
    """The spec and weights (under the model's names, output-layer ``aux_layers``) of a drafter:
    eyas's own layouts and the foreign ones its family reads."""
    spec = read_spec(directory, target_layers)
    return spec, family_of(spec).weights_from(read_config(directory), read_weights(directory))


def options_set(directory: Path) -> list[str]:
    """The switches beyond its family as published that a drafter directory's config sets."""
    spec = read_spec(directory)
    return list(family_of(spec).options(spec))


def save_drafter(drafter: nn.Module, directory: Path, dtype: torch.dtype = CHECKPOINT_DTYPE) -> None:
    """A drafter module in its family's own layout (what checkpoints and ``train/final`` hold)."""
    save_weights(drafter.trainable_state_dict(), drafter.spec, directory, dtype)


def save_weights(
    weights: dict[str, torch.Tensor], spec: DrafterSpec, directory: Path, dtype: torch.dtype = CHECKPOINT_DTYPE
) -> None:
    """Saved weights in their family's own layout."""
    family_of(spec).save(weights, spec, directory, dtype)


def new_drafter(spec: DrafterSpec, embedding: torch.Tensor, lm_head: torch.Tensor) -> nn.Module:
    """A drafter of the spec's family on the target's embedding and head."""
    return family_of(spec).new(spec, embedding, lm_head)


def load_drafter(directory: str | Path, target_model) -> nn.Module:
    """Any family's drafter from a training checkpoint, ``train/final``, an export (any layout)
    or a foreign checkpoint, on the target's device with its embedding and head."""
    from eyas.target.capture import check_aux_layers, num_decoder_layers

    num_layers = num_decoder_layers(target_model)
    spec, weights = read_drafter(Path(directory), num_layers)
    where = f"{Path(directory) / CONFIG_FILE}: aux layers"
    check_aux_layers(list(spec.aux_layers), num_layers, where, family_of(spec).aux_layer_count)
    embedding = target_model.get_input_embeddings().weight
    drafter = new_drafter(spec, embedding, target_model.get_output_embeddings().weight)
    drafter.load_weights(weights, str(directory))
    return drafter.to(embedding.device)
