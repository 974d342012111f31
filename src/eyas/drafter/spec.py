"""The drafter's sizes, derived from the target's config and ``train.*`` overrides.

One frozen dataclass that every family's spec extends (:mod:`eyas.drafter.families`) and every
drafter builder, checkpoint and export reads, so the sizes written to ``config.json`` are the
sizes the weights have.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

from eyas.config import ConfigError, TrainConfig
from eyas.target import text_config


@dataclass(frozen=True)
class DrafterSpec:
    family: ClassVar[str | None] = None
    """The family a spec of this type is (:mod:`eyas.drafter.families`); the base sizes are none."""

    vocab_size: int
    """Target vocabulary (the embedding's rows)."""
    draft_vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_parameters: dict[str, Any]
    """transformers-5 style: ``rope_type``, ``rope_theta`` and the scaling fields."""
    max_position_embeddings: int
    target_hidden_size: int
    aux_layers: tuple[int, ...]
    """0-based target decoder layers whose outputs feed ``fc``, in concatenation order."""
    hidden_act: str = "silu"

    def sizes(self) -> dict[str, Any]:
        """The base fields, to build a family's spec from these sizes."""
        return {f.name: getattr(self, f.name) for f in fields(DrafterSpec)}

    def draft_length(self, wanted: int) -> int:
        """Tokens one verification pass drafts when ``wanted`` are asked for: what every engine is
        asked for. A chain drafter runs one step per token, so as many as asked."""
        return wanted

    def llama_config(self):
        """A one-layer LlamaConfig with these sizes (for RoPE and the MLP)."""
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=1,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters=dict(self.rope_parameters),
            max_position_embeddings=self.max_position_embeddings,
            hidden_act=self.hidden_act,
            mlp_bias=False,
            attention_bias=False,
        )


def rope_parameters_of(target_config) -> dict[str, Any]:
    """The target's RoPE settings, whether its config is transformers-5 or 4.x style."""
    params = getattr(target_config, "rope_parameters", None)
    if params:
        return dict(params)
    params = dict(getattr(target_config, "rope_scaling", None) or {"rope_type": "default"})
    params.setdefault("rope_type", params.pop("type", "default"))
    params["rope_theta"] = getattr(target_config, "rope_theta", 10000.0)
    return params


def spec_for_target(target_config, train: TrainConfig, aux_layers: list[int], draft_vocab_size: int) -> DrafterSpec:
    """Drafter sizes: the target's, each overridable by its ``train.*`` key (a family's
    :meth:`~eyas.drafter.family.Family.spec` adds its own)."""
    text = text_config(target_config)
    target_hidden = text.hidden_size
    hidden = train.hidden_size or target_hidden
    if hidden != target_hidden:
        raise ConfigError(
            f"train.hidden_size: {hidden} differs from the target's {target_hidden}; the drafter reuses the "
            "target's token embedding, so its hidden size must equal the target's (leave it unset)"
        )
    heads = train.num_attention_heads or text.num_attention_heads
    kv_heads = train.num_key_value_heads or (text.num_key_value_heads if heads == text.num_attention_heads else heads)
    if heads % kv_heads:
        raise ConfigError(f"train.num_key_value_heads: {kv_heads} does not divide the {heads} attention heads")
    target_head_dim = getattr(text, "head_dim", None) or target_hidden // text.num_attention_heads
    head_dim = target_head_dim if heads == text.num_attention_heads else hidden // heads
    return DrafterSpec(
        vocab_size=text.vocab_size,
        draft_vocab_size=draft_vocab_size,
        hidden_size=hidden,
        intermediate_size=train.intermediate_size or text.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(text.rms_norm_eps),
        rope_parameters=rope_parameters_of(text),
        max_position_embeddings=text.max_position_embeddings,
        target_hidden_size=target_hidden,
        aux_layers=tuple(aux_layers),
    )
