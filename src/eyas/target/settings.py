"""What the engines that run the target take from a stage: small frozen settings, one per use.

The engines (:mod:`.engines`, :mod:`.vllm_engine`) read the target's own section
(``TargetConfig``) and one of these, never a whole run config: a stage builds its settings from
its own section (``Sampling.from_config(config.generate)``), so a stage's keys can change without
the engines knowing, and a tool or a test drives an engine without a run config. ``ServedTarget``
is the target as a vLLM child loads it, resolved once from ``TargetConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass

from eyas.config import EvalConfig, ExtractConfig, GenerateConfig, TargetConfig


@dataclass(frozen=True)
class ServedTarget:
    """The target as a vLLM child loads it, and how eyas runs that child."""

    model: str
    """A local directory (the embedded and GGUF targets converted) or a hub id."""
    revision: str | None
    trust_remote_code: bool
    dtype: str
    """As engines spell it (``bfloat16``)."""
    python: str
    """The absolute path of the interpreter that imports vllm."""
    timeout_s: float
    """Longest wait for any answer of the child, its start included."""

    @classmethod
    def of(cls, target: TargetConfig, dtype: str | None = None) -> ServedTarget:
        """``target`` resolved, in ``dtype`` (default: the dtype eyas computes in on its device)."""
        from eyas.target import dtype_name, resolve_target
        from eyas.target.vllm import vllm_python

        source = resolve_target(target)
        return cls(
            source.name_or_path,
            source.revision,
            target.trust_remote_code,
            dtype or dtype_name(target),
            vllm_python(target.vllm_python),
            target.engine_timeout_s,
        )

    def load_settings(self) -> dict:
        """What every child's ``load_llm`` reads (``eyas_child.py``)."""
        return {
            "target": self.model,
            "revision": self.revision,
            "trust_remote_code": self.trust_remote_code,
            "dtype": self.dtype,
        }


@dataclass(frozen=True)
class Sampling:
    """How answers are sampled (``generate``, prompt synthesis)."""

    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    batch_size: int
    """Prompts per batch (transformers: left-padded; vLLM batches continuously within it)."""
    stop: tuple[str, ...] = ()
    """Extra stop strings."""
    tensor_parallel_size: int = 1
    """vLLM only: GPUs the target is split over."""

    @classmethod
    def from_config(cls, g: GenerateConfig) -> Sampling:
        return cls(g.max_tokens, g.temperature, g.top_p, g.seed, g.batch_size, tuple(g.stop), g.tensor_parallel_size)


@dataclass(frozen=True)
class PrefillCapture:
    """How the aux and final states of whole samples are captured (``extract``)."""

    packing: str
    """transformers only: ``packed``, ``padded`` or ``auto``."""
    tensor_parallel_size: int = 1
    """vLLM only, like the two below."""
    pipeline_parallel_size: int = 1
    expert_parallel: bool = False

    @classmethod
    def from_config(cls, x: ExtractConfig) -> PrefillCapture:
        return cls(x.packing, x.tensor_parallel_size, x.pipeline_parallel_size, x.expert_parallel)


@dataclass(frozen=True)
class SpeculativeDecoding:
    """How vLLM decodes the eval prompts, with or without the drafter (``eval``)."""

    num_draft_tokens: int
    """Asked of vLLM (``num_speculative_tokens``): what the drafter drafts in one pass."""
    max_new_tokens: int
    temperature: float
    seed: int
    tensor_parallel_size: int = 1

    @classmethod
    def from_config(cls, e: EvalConfig, draft_length: int) -> SpeculativeDecoding:
        """``eval``'s settings with the drafter's ``draft_length`` (``eval.num_draft_tokens`` as the
        drafter drafts them, :func:`eyas.eval.draft_length`)."""
        return cls(draft_length, e.max_new_tokens, e.temperature, e.seed, e.tensor_parallel_size)
