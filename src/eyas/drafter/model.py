"""The EAGLE-3 drafter: the module SGLang and vLLM load as ``LlamaForCausalLMEagle3``.

Shape (names are the exported weight names):

- ``embed_tokens``: the target's token embedding, frozen, never saved;
- ``input_norm`` (EAGLE-3.1, ``norm_before_fc``): RMSNorm(3·H_target) over the concatenated aux
  hidden states, then ``fc``: Linear(3·H_target → H);
- ``midlayer``: one Llama decoder layer whose attention input is
  ``cat(input_layernorm(embedding), hidden_norm(hidden))`` (width 2H) and whose residual is
  the hidden stream, then the usual gated MLP;
- ``norm`` and ``lm_head`` over the draft vocabulary; buffers ``d2t`` (draft id + d2t =
  target id) and ``t2d`` (which target ids the draft vocabulary holds).

The layer's output *before* ``norm`` is the hidden state fed back at the next drafting step;
with ``norm_output`` (EAGLE-3.1) the output *after* it, which ``lm_head`` then reads directly.
Two callers drive the layer: :meth:`Eagle3Drafter.unroll` (training-time test over whole
sequences) and :class:`eyas.drafter.session.DraftSession` (incremental, as servers run it); both
go through :meth:`Midlayer.project` and :meth:`Midlayer.finish`, so they cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

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


class Midlayer(nn.Module):
    """The drafter's single decoder layer; attention math is left to the caller (masks differ)."""

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        h = spec.hidden_size
        self.num_heads, self.num_kv_heads, self.head_dim = (
            spec.num_attention_heads,
            spec.num_key_value_heads,
            spec.head_dim,
        )
        self.self_attn = attention_projections(spec, 2 * h)
        self.mlp = LlamaMLP(spec.llama_config())
        self.input_layernorm = LlamaRMSNorm(h, eps=spec.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=spec.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=spec.rms_norm_eps)

    def project(self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Queries [B,heads,T,d] and rotated keys/values [B,kv_heads,T,d] for one drafting step."""
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        b, t, _ = x.shape
        attn = self.self_attn
        q = attn.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def finish(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The layer's output hidden state (pre-norm) from the attention result [B,heads,T,d]."""
        b, _, t, _ = attended.shape
        hidden = hidden + self.self_attn.o_proj(attended.transpose(1, 2).reshape(b, t, -1))
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


def expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Repeat grouped KV heads to match the query heads (GQA)."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def ttt_attention(q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor, extra: list[tuple[torch.Tensor, torch.Tensor]]):
    """Attention at TTT step ``len(extra)``: causal over step-0 keys, plus each row's own keys of steps 1..k.

    Row t's step-k query sits at position t+k in serving; the positions t+1..t+k-1 between
    exist only as row t's own speculative steps, which is why they are a diagonal, not a matrix.
    """
    heads, t = q.shape[1], q.shape[2]
    scale = q.shape[-1] ** -0.5
    scores = q @ expand_kv(k0, heads).transpose(-1, -2) * scale
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    diag = [(q * expand_kv(k, heads)).sum(-1, keepdim=True) * scale for k, _ in extra]
    probs = torch.softmax(torch.cat([scores, *diag], dim=-1).float(), dim=-1).to(q.dtype)
    out = probs[..., :t] @ expand_kv(v0, heads)
    for i, (_, v) in enumerate(extra):
        out = out + probs[..., t + i : t + i + 1] * expand_kv(v, heads)
    return out


class DrafterWeights:
    """What both families share about their saved weights: everything but the target's parts."""

    spec: DrafterSpec

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Everything that is saved: all weights and buffers except the target's embedding and head."""
        return saved_only(self.state_dict())

    def save(self, directory: str | Path) -> None:
        """Write ``config.json`` and ``model.safetensors`` in the family's servable layout."""
        from eyas.drafter.layout import save_drafter

        save_drafter(self.trainable_state_dict(), self.spec, Path(directory))

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


class Eagle3Drafter(DrafterWeights, nn.Module):
    """EAGLE-3 draft model; see the module docstring for the shape."""

    def __init__(self, spec: DrafterSpec, embedding: torch.Tensor | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.embed_tokens.requires_grad_(False)
        if embedding is not None:
            self.set_embedding(embedding)
        if spec.norm_before_fc:
            self.input_norm = LlamaRMSNorm(3 * spec.target_hidden_size, eps=spec.rms_norm_eps)
        self.fc = nn.Linear(3 * spec.target_hidden_size, spec.hidden_size, bias=False)
        self.midlayer = Midlayer(spec)
        self.norm = LlamaRMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.lm_head = nn.Linear(spec.hidden_size, spec.draft_vocab_size, bias=False)
        self.rotary = LlamaRotaryEmbedding(spec.llama_config())
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(spec.vocab_size, dtype=torch.bool))

    def set_embedding(self, weight: torch.Tensor) -> None:
        """Use the target's embedding (shared, not copied, when dtype and device already match)."""
        if tuple(weight.shape) != (self.spec.vocab_size, self.spec.hidden_size):
            raise ValueError(
                f"target embedding is {tuple(weight.shape)}, the drafter needs "
                f"({self.spec.vocab_size}, {self.spec.hidden_size})"
            )
        self.embed_tokens.weight = nn.Parameter(weight.detach().to(torch.float32), requires_grad=False)

    def set_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def rope(self, like: torch.Tensor, positions: torch.Tensor):
        """cos/sin for ``positions`` [B,T] (the target's RoPE settings)."""
        return self.rotary(like, positions)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The hidden state of step 0 from the concatenated aux states [.., 3·H_target]."""
        aux = aux.to(self.fc.weight.dtype)
        return self.fc(self.input_norm(aux) if self.spec.norm_before_fc else aux)

    def fed_back(self, layer_output: torch.Tensor) -> torch.Tensor:
        """The state the next step reads (and :meth:`logits` takes) from the layer's output."""
        return self.norm(layer_output) if self.spec.norm_output else layer_output

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits from a fed-back state (:meth:`fed_back`)."""
        return self.lm_head(hidden if self.spec.norm_output else self.norm(hidden))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def unroll(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int) -> Iterator[torch.Tensor]:
        """Training-time test over whole sequences: yield draft logits [B,T,V_draft] per step.

        Step k, row t: the token x_{t+1+k}, RoPE position t+k, the hidden state is the
        fused aux state at step 0 and the layer's own previous output after; its logits
        predict the target's distribution at position t+1+k. Tokens past the end are 0
        (their positions carry no loss).
        """
        b, t = input_ids.shape
        hidden = self.fuse(aux)
        positions = torch.arange(t, device=input_ids.device).expand(b, t)
        padded = F.pad(input_ids, (0, steps))
        k0 = v0 = None
        extra: list[tuple[torch.Tensor, torch.Tensor]] = []
        for step in range(steps):
            embeds = self.embed_tokens(padded[:, 1 + step : 1 + step + t])
            cos, sin = self.rope(embeds, positions + step)
            q, k, v = self.midlayer.project(embeds, hidden, cos, sin)
            if step == 0:
                k0, v0 = k, v
            else:
                extra.append((k, v))
            hidden = self.fed_back(self.midlayer.finish(hidden, ttt_attention(q, k0, v0, extra)))
            yield self.logits(hidden)

    def forward(self, aux: torch.Tensor, input_ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """All steps' logits at once (what DDP wraps)."""
        return list(self.unroll(aux, input_ids, steps))

    @classmethod
    def load(cls, directory: str | Path, target_model) -> Eagle3Drafter:
        """An EAGLE-3 drafter from a training checkpoint, ``train/final``, an export (any format)
        or a foreign EAGLE-3 checkpoint; the embedding comes from ``target_model``."""
        from eyas.drafter.families import load_drafter

        drafter = load_drafter(directory, target_model)
        if not isinstance(drafter, cls):
            raise ValueError(f"{directory}: holds a {type(drafter).__name__}, not an EAGLE-3 drafter")
        return drafter


def saved_only(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A drafter state dict without the target's embedding and head (never saved) and RoPE tables."""
    return {k: v for k, v in state.items() if not k.startswith(("embed_tokens.", "target_head.", "rotary."))}
