"""What every drafter family builds on: the attention projections under the names the engines
load, grouped-query key/value expansion, and the weights a drafter saves (everything but the
target's own embedding and head)."""

from __future__ import annotations

import torch
from torch import nn

from eyas.drafter.spec import DrafterSpec


def attention_projections(spec: DrafterSpec, input_width: int) -> nn.Module:
    """``self_attn`` with the q/k/v/o projections under the names the engines load, reading
    ``input_width`` features (EAGLE-3's layer reads 2H, DFlash's H)."""
    heads, kv = spec.num_attention_heads * spec.head_dim, spec.num_key_value_heads * spec.head_dim
    attn = nn.Module()
    attn.q_proj = nn.Linear(input_width, heads, bias=False)
    attn.k_proj = nn.Linear(input_width, kv, bias=False)
    attn.v_proj = nn.Linear(input_width, kv, bias=False)
    attn.o_proj = nn.Linear(heads, spec.hidden_size, bias=False)
    return attn


def expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Repeat grouped KV heads to match the query heads (GQA)."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def saved_only(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A drafter state dict without the target's embedding and head (never saved) and RoPE tables."""
    return {k: v for k, v in state.items() if not k.startswith(("embed_tokens.", "target_head.", "rotary."))}


class DrafterWeights:
    """What every family shares about its saved weights: everything but the target's parts."""

    spec: DrafterSpec

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Everything that is saved: all weights and buffers except the target's embedding and head."""
        return saved_only(self.state_dict())

    def check_weights(self, weights: dict[str, torch.Tensor], source: str) -> None:
        """Refuse a weight set whose names differ from this drafter's (shapes are checked on load)."""
        expected = set(self.trainable_state_dict())
        missing, unexpected = expected - set(weights), set(weights) - expected
        if missing or unexpected:
            raise ValueError(
                f"{source}: drafter weights do not match the config"
                f" (missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]})"
            )

    def load_weights(self, weights: dict[str, torch.Tensor], source: str) -> None:
        self.check_weights(weights, source)
        self.load_state_dict(weights, strict=False)
