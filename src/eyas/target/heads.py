"""The two pieces of the target that training needs besides hidden states: embedding and lm_head.

Online training has the whole target loaded anyway. Offline training reads only these two
tensors from the target's safetensors files, because the point of offline mode is a target
too large to sit next to the drafter (a 1T-parameter MoE's embedding and head are ~5 GB;
the model is ~600 GB).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from eyas.config import ConfigError, TargetConfig
from eyas.target import load_model_config, pick_dtype, resolve_target, text_config

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


@dataclass
class TargetParts:
    config: Any
    """The target's text config (sizes, vocabulary, RoPE)."""
    embedding: torch.Tensor
    """[V, H] token embedding."""
    lm_head: torch.Tensor
    """[V, H] output projection (the embedding itself when tied)."""


def from_model(model) -> TargetParts:
    return TargetParts(
        text_config(model.config), model.get_input_embeddings().weight, model.get_output_embeddings().weight
    )


def _pick(names: list[str], suffix: str) -> str | None:
    """The tensor named ``...suffix`` of the language model (shortest name: no vision tower, no MTP)."""
    found = sorted((n for n in names if n.endswith(suffix)), key=len)
    return found[0] if found else None


def _fetch(target: TargetConfig, filename: str) -> Path:
    source = resolve_target(target)
    if source.is_local:
        return Path(source.name_or_path) / filename
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(source.name_or_path, filename, revision=source.revision))


def from_files(target: TargetConfig, device: torch.device) -> TargetParts:
    """Embedding and lm_head read straight from the target's safetensors (no model load)."""
    config = text_config(load_model_config(target))
    weight_map = _weight_map(target)
    names = list(weight_map)
    embed_name = _pick(names, "embed_tokens.weight")
    head_name = _pick(names, "lm_head.weight")
    if embed_name is None:
        raise ConfigError(f"target.model: no '*embed_tokens.weight' tensor among the target's {len(names)} weights")
    dtype = pick_dtype(target, device)

    def read(name: str) -> torch.Tensor:
        with safe_open(str(_fetch(target, weight_map[name])), framework="pt") as f:
            return f.get_tensor(name).to(device=device, dtype=dtype)

    embedding = read(embed_name)
    if head_name is None and not getattr(config, "tie_word_embeddings", False):
        raise ConfigError("target.model: no 'lm_head.weight' tensor and the embeddings are not tied")
    return TargetParts(config, embedding, read(head_name) if head_name else embedding)


def _weight_map(target: TargetConfig) -> dict[str, str]:
    """Tensor name → file: from the shard index, or the single ``model.safetensors``."""
    from huggingface_hub.errors import EntryNotFoundError

    try:
        index = _fetch(target, INDEX_FILE)
    except EntryNotFoundError:
        index = None
    if index is not None and index.is_file():
        return json.loads(index.read_text())["weight_map"]
    with safe_open(str(_fetch(target, SINGLE_FILE)), framework="pt") as f:
        return {name: SINGLE_FILE for name in f.keys()}
