"""On-disk drafter layouts: SGLang/vLLM (``LlamaForCausalLMEagle3``) and speculators (``Eagle3Speculator``).

Training checkpoints and ``train/final`` use the SGLang/vLLM layout too, so a checkpoint is
already servable and :func:`read_drafter` loads any of them. The key lists below are the
documented ones; tests hold golden copies.

Layer ids: eyas's ``aux_layers`` are 0-based decoder layers whose *outputs* feed ``fc``. The
engines number the same tensors two ways, and a mix-up shifts every layer by one (the drafter
still loads, and acceptance quietly drops):

- SGLang reads ``eagle_config.eagle_aux_hidden_state_layer_ids`` as output-layer ids and
  captures the input of layer id+1 (recent SGLang adds the 1 only when the first id is 1, so
  a first id other than 1 is warned about where the ids are checked). SpecForge and
  Model-Optimizer write this numbering.
- vLLM (and llama.cpp's converter, which copies the ids to ``eagle3.target_layers``) reads the
  top-level ``eagle_aux_hidden_state_layer_ids`` as "the hidden state entering layer k" (HF
  ``hidden_states[k]``), so it gets ``aux_layers + 1``; so does the speculators config, which
  vLLM reads the same way.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from eyas.drafter.dflash import DFlashSpec
from eyas.drafter.spec import DrafterSpec
from eyas.target.capture import default_aux_layers, hf_hidden_state_indices
from eyas.tensorfile import save_tensors

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
SGLANG_ARCH = "LlamaForCausalLMEagle3"
SPECULATORS_ARCH = "Eagle3Speculator"
DFLASH_ARCH = "DFlashDraftModel"
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


def _rope_keys(spec: DrafterSpec) -> dict[str, Any]:
    """RoPE as both transformers generations read it: 4.x ``rope_theta``/``rope_scaling``, 5.x ``rope_parameters``."""
    params = dict(spec.rope_parameters)
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return {
        "rope_theta": params.get("rope_theta", 10000.0),
        "rope_scaling": None if scaling.get("rope_type", "default") == "default" else scaling,
    }


def _llama_keys(spec: DrafterSpec, dtype: torch.dtype) -> dict[str, Any]:
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
        "torch_dtype": dtype_name(dtype),
    }


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def sglang_config(spec: DrafterSpec, dtype: torch.dtype = CHECKPOINT_DTYPE) -> dict[str, Any]:
    """``config.json`` for SGLang and vLLM: each reads its own key, in its own numbering."""
    return {
        "architectures": [SGLANG_ARCH],
        **_llama_keys(spec, dtype),
        "draft_vocab_size": spec.draft_vocab_size,
        "target_hidden_size": spec.target_hidden_size,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(spec.aux_layers), "use_aux_hidden_state": True},
        "eagle_aux_hidden_state_layer_ids": hf_hidden_state_indices(list(spec.aux_layers)),
        **eagle3_1_keys(spec),
    }


EAGLE3_1_KEYS = ("norm_before_fc", "norm_output")


def eagle3_1_keys(spec: DrafterSpec) -> dict[str, bool]:
    """EAGLE-3.1's top-level keys, where vLLM and llama.cpp's converter read them; written only
    when set, so an EAGLE-3 drafter's config is what it always was."""
    return {key: True for key in EAGLE3_1_KEYS if getattr(spec, key)}


def options_set(directory: Path) -> list[str]:
    """The EAGLE-3.1 keys a drafter directory's ``config.json`` sets (any layout)."""
    config = json.loads((directory / CONFIG_FILE).read_text())
    return [key for key in EAGLE3_1_KEYS if config.get(key)]


def speculators_config(
    spec: DrafterSpec, verifier: str, verifier_architectures: list[str], steps: int, dtype: torch.dtype
) -> dict[str, Any]:
    """``config.json`` in the speculators ``Eagle3Speculator`` layout (vLLM's layer numbering)."""
    return {
        "architectures": [SPECULATORS_ARCH],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {"architectures": ["LlamaForCausalLM"], **_llama_keys(spec, dtype)},
        "draft_vocab_size": spec.draft_vocab_size,
        "norm_before_residual": False,
        "target_hidden_size": spec.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": hf_hidden_state_indices(list(spec.aux_layers)),
        **eagle3_1_keys(spec),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": steps}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": verifier_architectures},
        },
        "torch_dtype": dtype_name(dtype),
    }


def to_speculators_keys(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v for k, v in weights.items()}


def from_speculators_keys(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {("midlayer." + k[len("layers.0.") :] if k.startswith("layers.0.") else k): v for k, v in weights.items()}


def _cast(weights: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies, floating tensors in ``dtype`` (``d2t``/``t2d`` keep their integer/bool types)."""
    return {k: (v.to(dtype) if v.is_floating_point() else v).detach().cpu().contiguous() for k, v in weights.items()}


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def dflash_config(spec: DFlashSpec, dtype: torch.dtype = CHECKPOINT_DTYPE) -> dict[str, Any]:
    """``config.json`` of z-lab's ``DFlashDraftModel`` layout. ``target_layer_ids`` are output-layer
    ids (0-based), the numbering vLLM and SGLang read and llama.cpp's converter shifts by one."""
    settings = {
        "mask_token_id": spec.mask_token_id,
        "target_layer_ids": list(spec.aux_layers),
        "block_size": spec.block_size,
    }
    return {
        "architectures": [DFLASH_ARCH],
        **_llama_keys(spec, dtype),
        "model_type": "qwen3",
        "num_hidden_layers": spec.num_layers,
        "target_hidden_size": spec.target_hidden_size,
        "block_size": spec.block_size,
        "dflash_config": settings,
    }


def save_drafter(
    weights: dict[str, torch.Tensor], spec: DrafterSpec, directory: Path, dtype: torch.dtype = CHECKPOINT_DTYPE
) -> None:
    """The drafter in its family's servable layout: SGLang/vLLM EAGLE-3, or DFlash."""
    directory.mkdir(parents=True, exist_ok=True)
    save_tensors(_cast(weights, dtype), directory / WEIGHTS_FILE)
    config = dflash_config(spec, dtype) if isinstance(spec, DFlashSpec) else sglang_config(spec, dtype)
    write_json(directory / CONFIG_FILE, config)


def save_speculators(
    weights: dict[str, torch.Tensor],
    spec: DrafterSpec,
    directory: Path,
    verifier: str,
    verifier_architectures: list[str],
    steps: int,
    dtype: torch.dtype,
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_tensors(_cast(to_speculators_keys(weights), dtype), directory / WEIGHTS_FILE)
    write_json(directory / CONFIG_FILE, speculators_config(spec, verifier, verifier_architectures, steps, dtype))


def read_drafter(directory: Path, target_layers: int | None = None) -> tuple[DrafterSpec, dict[str, torch.Tensor]]:
    """The spec and weights (SGLang key names, output-layer ``aux_layers``) of a drafter, EAGLE-3 or DFlash.

    Reads eyas's own layouts and foreign ones: SpecForge/SGLang-style (``eagle_config`` ids),
    vLLM-style (top-level ids only), speculators, and the original EAGLE-3 releases
    (``pytorch_model.bin``, no ids: the default layers of a ``target_layers``-layer target).
    """
    weights_path = next((directory / f for f in (WEIGHTS_FILE, LEGACY_WEIGHTS_FILE) if (directory / f).is_file()), None)
    if not (directory / CONFIG_FILE).is_file() or weights_path is None:
        raise FileNotFoundError(f"{directory}: not a drafter directory (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    spec = read_spec(directory, target_layers)
    if weights_path.name == WEIGHTS_FILE:
        weights = load_file(str(weights_path))
    else:
        weights = torch.load(weights_path, map_location="cpu", weights_only=True)
    # Some trainers save the target's embedding with the drafter; eyas always takes the target's own.
    weights = {k: v for k, v in weights.items() if k != "embed_tokens.weight"}
    is_speculators = json.loads((directory / CONFIG_FILE).read_text()).get("architectures") == [SPECULATORS_ARCH]
    return spec, from_speculators_keys(weights) if is_speculators else weights


def read_spec(directory: Path, target_layers: int | None = None) -> DrafterSpec:
    """The spec of a drafter in any layout :func:`read_drafter` reads, from its ``config.json``
    alone (what an engine is asked for, such as the draft length, without loading weights)."""
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"{directory}: not a drafter directory (needs {CONFIG_FILE} and {WEIGHTS_FILE})")
    config = json.loads(config_path.read_text())
    try:
        if config.get("architectures") == [SPECULATORS_ARCH]:
            layers = aux_layers_of(config, config_path, target_layers)
            return _spec_from_keys(config["transformer_layer_config"], config, layers)
        if config.get("architectures") == [SGLANG_ARCH]:
            return _spec_from_keys(config, config, aux_layers_of(config, config_path, target_layers))
        if config.get("architectures") == [DFLASH_ARCH]:
            return _dflash_spec(config)
    except KeyError as e:
        raise ValueError(f"{config_path}: missing key {e.args[0]!r}") from None
    raise ValueError(
        f"{config_path}: architectures must be [{SGLANG_ARCH!r}], [{SPECULATORS_ARCH!r}] or [{DFLASH_ARCH!r}]"
    )


def _dflash_spec(config: dict[str, Any]) -> DFlashSpec:
    settings = config["dflash_config"]
    base = _spec_from_keys(config, config, settings["target_layer_ids"])
    return DFlashSpec(
        **{f.name: getattr(base, f.name) for f in fields(DrafterSpec)},
        num_layers=config["num_hidden_layers"],
        block_size=settings.get("block_size", config.get("block_size")),
        mask_token_id=settings["mask_token_id"],
    )


def family_of(directory: Path) -> str:
    """``dflash`` or ``eagle3``: the drafter family a directory's ``config.json`` holds."""
    config = json.loads((directory / CONFIG_FILE).read_text())
    return "dflash" if config.get("architectures") == [DFLASH_ARCH] else "eagle3"


def aux_layers_of(config: dict[str, Any], config_path: Path, target_layers: int | None) -> list[int]:
    """Output-layer ids from whichever key the config has, in that key's numbering.

    ``eagle_config`` (SGLang's) wins where both exist: it is what SpecForge and SGLang write,
    and eyas exports before the numbering fix wrote output-layer ids under both keys.
    """
    sglang_ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if sglang_ids is not None:
        return list(sglang_ids)
    before_layer_ids = config.get("eagle_aux_hidden_state_layer_ids")
    if before_layer_ids is not None:
        return [i - 1 for i in before_layer_ids]
    if target_layers is None:
        raise ValueError(
            f"{config_path}: names no eagle_aux_hidden_state_layer_ids; the default layers depend on the target, "
            "so load it with the target's layer count"
        )
    return default_aux_layers(target_layers)


def _spec_from_keys(llama: dict[str, Any], top: dict[str, Any], aux_layers: list[int]) -> DrafterSpec:
    """Rebuild the spec from the documented keys (so third-party EAGLE-3 drafters load too)."""
    rope = {"rope_type": "default", **(llama.get("rope_scaling") or {}), "rope_theta": llama.get("rope_theta", 10000.0)}
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
        norm_before_fc=bool(top.get("norm_before_fc", False)),
        norm_output=bool(top.get("norm_output", False)),
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
