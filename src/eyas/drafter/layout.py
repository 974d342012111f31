"""What every drafter layout on disk shares: file names, precision, the Llama-style keys of the
drafter's layers, and a drafter's identity by content. Each family's own ``config.json`` (and the
layer-id numbering each engine reads) is in its module under :mod:`eyas.drafter.families`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from eyas.drafter.spec import DrafterSpec
from eyas.tensorfile import save_tensors

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
LEGACY_WEIGHTS_FILE = "pytorch_model.bin"
"""The original EAGLE-3 releases ship their weights as a pickled state dict."""
CHECKPOINT_DTYPE = torch.float32
"""Training checkpoints and ``train/final`` keep full precision; exports follow the target."""
SERVED_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def target_dtype(model_config: Any) -> torch.dtype:
    """The dtype the target's checkpoint declares, which every export is written and served in
    (llama.cpp's GGUF files, measured by eval, included); bfloat16 when it names none or a
    quantized one."""
    declared = getattr(model_config, "dtype", None) or getattr(model_config, "torch_dtype", None)
    return SERVED_DTYPES.get(str(declared).removeprefix("torch."), torch.bfloat16)


def rope_keys(spec: DrafterSpec) -> dict[str, Any]:
    """RoPE as both transformers generations read it: 4.x ``rope_theta``/``rope_scaling``, 5.x ``rope_parameters``."""
    params = dict(spec.rope_parameters)
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return {
        "rope_theta": params.get("rope_theta", 10000.0),
        "rope_scaling": None if scaling.get("rope_type", "default") == "default" else scaling,
    }


def llama_keys(spec: DrafterSpec, dtype: torch.dtype) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "num_hidden_layers": 1,
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "hidden_act": spec.hidden_act,
        "rms_norm_eps": spec.rms_norm_eps,
        **rope_keys(spec),
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": dtype_name(dtype),
    }


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def cast(weights: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies, floating tensors in ``dtype`` (``d2t``/``t2d`` keep their integer/bool types)."""
    return {k: (v.to(dtype) if v.is_floating_point() else v).detach().cpu().contiguous() for k, v in weights.items()}


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_layout(weights: dict[str, torch.Tensor], config: dict[str, Any], directory: Path, dtype: torch.dtype) -> None:
    """``model.safetensors`` (floating tensors in ``dtype``) and ``config.json`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    save_tensors(cast(weights, dtype), directory / WEIGHTS_FILE)
    write_json(directory / CONFIG_FILE, config)


def read_config(directory: Path) -> dict[str, Any]:
    """A drafter directory's ``config.json``."""
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: not a drafter directory (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    return json.loads(path.read_text())


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """A drafter directory's weights, ``model.safetensors`` or the original EAGLE-3 releases'
    pickled ``pytorch_model.bin``, without a copy of the target's embedding (some trainers save
    one; eyas always takes the target's own)."""
    path = next((directory / f for f in (WEIGHTS_FILE, LEGACY_WEIGHTS_FILE) if (directory / f).is_file()), None)
    if path is None:
        raise FileNotFoundError(f"{directory}: not a drafter directory (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    if path.name == WEIGHTS_FILE:
        weights = load_file(str(path))
    else:
        weights = torch.load(path, map_location="cpu", weights_only=True)
    return {k: v for k, v in weights.items() if k != "embed_tokens.weight"}


def sizes_from_keys(llama: dict[str, Any], top: dict[str, Any], aux_layers: list[int]) -> DrafterSpec:
    """The sizes every family's spec has, from the Llama-style keys of its layers (``llama``) and
    the drafter's top-level keys (``top``), as eyas and third-party trainers write them."""
    rope = llama.get("rope_parameters") or {
        "rope_type": "default",
        **(llama.get("rope_scaling") or {}),
        "rope_theta": llama.get("rope_theta", 10000.0),
    }
    return DrafterSpec(
        vocab_size=llama["vocab_size"],
        draft_vocab_size=top.get("draft_vocab_size") or llama["vocab_size"],
        hidden_size=llama["hidden_size"],
        intermediate_size=llama["intermediate_size"],
        num_attention_heads=llama["num_attention_heads"],
        num_key_value_heads=llama.get("num_key_value_heads") or llama["num_attention_heads"],
        head_dim=llama.get("head_dim") or llama["hidden_size"] // llama["num_attention_heads"],
        rms_norm_eps=llama["rms_norm_eps"],
        rope_parameters=rope,
        max_position_embeddings=llama["max_position_embeddings"],
        target_hidden_size=top.get("target_hidden_size") or llama["hidden_size"],
        aux_layers=tuple(aux_layers),
        hidden_act=llama.get("hidden_act", "silu"),
    )


def content_digest(directory: Path) -> str | None:
    """A drafter's identity by content — its config and weights, not its README, stage marker
    or path — so the same drafter in two layouts shares eval results and a retrained one never
    does. None when there is no drafter there."""
    from eyas.paths import MARKER
    from eyas.records import content_hash
    from eyas.stage import file_digest

    if not (directory / CONFIG_FILE).is_file():
        return None
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.suffix != ".md" and p.name != MARKER)
    return content_hash({p.name: file_digest(p) for p in files})
