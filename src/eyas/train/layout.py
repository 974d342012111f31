"""On-disk drafter layouts: SGLang/vLLM (``LlamaForCausalLMEagle3``) and speculators (``Eagle3Speculator``).

Training checkpoints and ``train/final`` use the SGLang/vLLM layout too, so a checkpoint is
already servable and :func:`read_drafter` loads any of them. The key lists below are the
documented ones; tests hold golden copies.

``eagle_aux_hidden_state_layer_ids`` are 0-based decoder layers whose *outputs* feed ``fc``
(SGLang and vLLM capture the input of layer id+1, the same tensor).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from eyas.tensorfile import save_tensors
from eyas.train.spec import DrafterSpec

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
SGLANG_ARCH = "LlamaForCausalLMEagle3"
SPECULATORS_ARCH = "Eagle3Speculator"


def _rope_keys(spec: DrafterSpec) -> dict[str, Any]:
    """RoPE as both transformers generations read it: 4.x ``rope_theta``/``rope_scaling``, 5.x ``rope_parameters``."""
    params = dict(spec.rope_parameters)
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return {
        "rope_theta": params.get("rope_theta", 10000.0),
        "rope_scaling": None if scaling.get("rope_type", "default") == "default" else scaling,
    }


def _llama_keys(spec: DrafterSpec) -> dict[str, Any]:
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
        **_rope_keys(spec),
        "max_position_embeddings": spec.max_position_embeddings,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }


def sglang_config(spec: DrafterSpec) -> dict[str, Any]:
    """``config.json`` for SGLang and vLLM (both read this layout)."""
    layers = list(spec.aux_layers)
    return {
        "architectures": [SGLANG_ARCH],
        **_llama_keys(spec),
        "draft_vocab_size": spec.draft_vocab_size,
        "target_hidden_size": spec.target_hidden_size,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers, "use_aux_hidden_state": True},
        "eagle_aux_hidden_state_layer_ids": layers,
    }


def speculators_config(spec: DrafterSpec, verifier: str, verifier_architectures: list[str], steps: int) -> dict[str, Any]:
    """``config.json`` in the speculators ``Eagle3Speculator`` layout."""
    return {
        "architectures": [SPECULATORS_ARCH],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {"architectures": ["LlamaForCausalLM"], **_llama_keys(spec)},
        "draft_vocab_size": spec.draft_vocab_size,
        "norm_before_residual": False,
        "target_hidden_size": spec.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(spec.aux_layers),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": steps}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": verifier_architectures},
        },
        "torch_dtype": "float32",
    }


def to_speculators_keys(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v for k, v in weights.items()}


def from_speculators_keys(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {("midlayer." + k[len("layers.0.") :] if k.startswith("layers.0.") else k): v for k, v in weights.items()}


def _contiguous(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in weights.items()}


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def save_sglang(weights: dict[str, torch.Tensor], spec: DrafterSpec, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_tensors(_contiguous(weights), directory / WEIGHTS_FILE)
    write_json(directory / CONFIG_FILE, sglang_config(spec))


def save_speculators(
    weights: dict[str, torch.Tensor],
    spec: DrafterSpec,
    directory: Path,
    verifier: str,
    verifier_architectures: list[str],
    steps: int,
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_tensors(_contiguous(to_speculators_keys(weights)), directory / WEIGHTS_FILE)
    write_json(directory / CONFIG_FILE, speculators_config(spec, verifier, verifier_architectures, steps))


def read_drafter(directory: Path) -> tuple[DrafterSpec, dict[str, torch.Tensor]]:
    """The spec and weights (SGLang key names) of a drafter directory in any eyas-written layout."""
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    if not config_path.is_file() or not weights_path.is_file():
        raise FileNotFoundError(f"{directory}: not a drafter directory (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    config = json.loads(config_path.read_text())
    weights = load_file(str(weights_path))
    try:
        if config.get("architectures") == [SPECULATORS_ARCH]:
            spec = _spec_from_keys(config["transformer_layer_config"], config)
            return spec, from_speculators_keys(weights)
        if config.get("architectures") == [SGLANG_ARCH]:
            return _spec_from_keys(config, config), weights
    except KeyError as e:
        raise ValueError(f"{config_path}: missing key {e.args[0]!r}") from None
    raise ValueError(f"{config_path}: architectures must be [{SGLANG_ARCH!r}] or [{SPECULATORS_ARCH!r}]")


def _spec_from_keys(llama: dict[str, Any], top: dict[str, Any]) -> DrafterSpec:
    """Rebuild the spec from the documented keys (so third-party EAGLE-3 drafters load too)."""
    rope = {"rope_type": "default", **(llama.get("rope_scaling") or {}), "rope_theta": llama["rope_theta"]}
    return DrafterSpec(
        vocab_size=llama["vocab_size"],
        draft_vocab_size=top.get("draft_vocab_size") or llama["vocab_size"],
        hidden_size=llama["hidden_size"],
        intermediate_size=llama["intermediate_size"],
        num_attention_heads=llama["num_attention_heads"],
        num_key_value_heads=llama["num_key_value_heads"],
        head_dim=llama.get("head_dim") or llama["hidden_size"] // llama["num_attention_heads"],
        rms_norm_eps=llama["rms_norm_eps"],
        rope_parameters=rope,
        max_position_embeddings=llama["max_position_embeddings"],
        target_hidden_size=top.get("target_hidden_size") or llama["hidden_size"],
        aux_layers=tuple(top["eagle_aux_hidden_state_layer_ids"]),
        hidden_act=llama.get("hidden_act", "silu"),
    )
