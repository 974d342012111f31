"""EAGLE-3 (and its optional norms: EAGLE-3.1's two, speculators' trainer's third): the model SGLang and vLLM load as
``LlamaForCausalLMEagle3``, its training-time-test objective, its in-process drafting session,
and its layouts on disk.

Shape (names are the exported weight names):

- ``embed_tokens``: the target's token embedding, frozen, never saved;
- ``input_norm`` (EAGLE-3.1 as speculators trains it, ``norm_before_fc``): RMSNorm(3·H_target)
  over the concatenated aux hidden states; ``fc_norm.{0,1,2}`` (EAGLE-3.1 as vLLM, SGLang and
  TensorRT-LLM serve it, ``fc_norm``): an RMSNorm(H_target) over each aux state; then ``fc``:
  Linear(3·H_target → H);
- ``midlayer``: one Llama decoder layer whose attention input is
  ``cat(input_layernorm(embedding), hidden_norm(hidden))`` (width 2H) and whose residual is
  the hidden stream (its normed copy with ``norm_before_residual``), then the usual gated MLP;
- ``norm`` and ``lm_head`` over the draft vocabulary; buffers ``d2t`` (draft id + d2t =
  target id) and ``t2d`` (which target ids the draft vocabulary holds).

The layer's output *before* ``norm`` is the hidden state fed back at the next drafting step;
with ``norm_output`` (EAGLE-3.1) the output *after* it, which ``lm_head`` then reads directly.
Two callers drive the layer: :meth:`Eagle3Drafter.unroll` (training-time test over whole
sequences) and :class:`DraftSession` (incremental, as servers run it); both
go through :meth:`Midlayer.project` and :meth:`Midlayer.finish`, so they cannot drift apart.

Layouts: the SGLang/vLLM one (training checkpoints and ``train/final`` too, so a checkpoint is
already servable) and speculators' ``Eagle3Speculator``; foreign drafters in either load too,
speculators' own trainer's (``Eagle3DraftModel``) included.

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

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from eyas.config import Eagle3Config, RunConfig, TrainConfig
from eyas.drafter.criteria import Criterion
from eyas.drafter.family import VLLM_SERVER, Family, Training, TrainingInputs
from eyas.drafter.layout import dtype_name, llama_keys, sizes_from_keys, write_layout
from eyas.drafter.loss import StepStats, Targets, needed_positions, target_distribution, ttt_stats
from eyas.drafter.parts import DrafterWeights, attention_projections, expand_kv
from eyas.drafter.spec import DrafterSpec
from eyas.target.capture import default_aux_layers, hf_hidden_state_indices

SGLANG_ARCH = "LlamaForCausalLMEagle3"
SPECULATORS_ARCH = "Eagle3Speculator"
SPECULATORS_TRAINER_ARCH = "Eagle3DraftModel"
"""What speculators' own trainer (0.9) names the drafters it saves, in the speculators layout."""
SWITCHES = ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual")
"""The top-level ``config.json`` switches beyond EAGLE-3 as published (:class:`Eagle3Spec`)."""

SGLANG_UNREAD = ("norm_before_fc", "norm_before_residual")
"""Switches SGLang's EAGLE-3 model (``python/sglang/srt/models/llama_eagle3.py``) does not read
in the trees eyas has checked: it has no ``input_norm`` and adds the raw state as the residual. It
loads such a drafter without complaint and drafts from states it was not trained on (still
losslessly, but accepting little), so the README says so instead of printing its command. Its
EAGLE-3.1 support reads ``norm_output`` and the per-layer ``fc_norm``."""


@dataclass(frozen=True)
class Eagle3Spec(DrafterSpec):
    """The sizes plus EAGLE-3.1's two switches (``train.eagle3``); both off is EAGLE-3 as published."""

    family = "eagle3"
    norm_before_fc: bool = False
    """EAGLE-3.1 (speculators): RMSNorm over the concatenated aux states before ``fc``."""
    fc_norm: bool = False
    """EAGLE-3.1 (vLLM, SGLang, TensorRT-LLM): an RMSNorm over each aux state before ``fc``."""
    norm_output: bool = False
    """EAGLE-3.1: the post-norm state is fed back and read by ``lm_head``."""
    norm_before_residual: bool = False
    """speculators' trainer's default: the attention's residual is the normed hidden state."""


class Midlayer(nn.Module):
    """The drafter's single decoder layer; attention math is left to the caller (masks differ)."""

    def __init__(self, spec: Eagle3Spec) -> None:
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
        self.norm_before_residual = spec.norm_before_residual

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
        residual = self.hidden_norm(hidden) if self.norm_before_residual else hidden
        hidden = residual + self.self_attn.o_proj(attended.transpose(1, 2).reshape(b, t, -1))
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


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


class Eagle3Drafter(DrafterWeights, nn.Module):
    """EAGLE-3 draft model; see the module docstring for the shape."""

    def __init__(self, spec: Eagle3Spec, embedding: torch.Tensor | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.embed_tokens.requires_grad_(False)
        if embedding is not None:
            self.set_embedding(embedding)
        if spec.norm_before_fc:
            self.input_norm = LlamaRMSNorm(3 * spec.target_hidden_size, eps=spec.rms_norm_eps)
        if spec.fc_norm:
            self.fc_norm = nn.ModuleList(
                LlamaRMSNorm(spec.target_hidden_size, eps=spec.rms_norm_eps) for _ in spec.aux_layers
            )
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
        # Both may be set, as vLLM applies them: the one norm over all, then one per aux state.
        if self.spec.norm_before_fc:
            aux = self.input_norm(aux)
        if self.spec.fc_norm:
            aux = torch.cat([norm(x) for norm, x in zip(self.fc_norm, aux.chunk(len(self.fc_norm), -1))], -1)
        return self.fc(aux)

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


class DraftSession:
    """Chain drafting for one sequence (batch 1), as SGLang/vLLM run EAGLE-3 with top-k 1."""

    def __init__(self, drafter: Eagle3Drafter) -> None:
        self.drafter = drafter
        self.length = 0
        """Verified positions in the cache."""
        self._keys: Tensor | None = None
        self._values: Tensor | None = None
        self._hidden: Tensor | None = None
        """[1,1,H] state fed back from the last verified position (:meth:`Eagle3Drafter.fed_back`):
        feeds the first proposal."""

    def _attend(self, embeds: Tensor, hidden: Tensor, start: int, keys: Tensor | None, values: Tensor | None):
        """Run the layer for new rows at positions start.. given earlier keys/values (all visible)."""
        layer = self.drafter.midlayer
        n = embeds.shape[1]
        positions = torch.arange(start, start + n, device=embeds.device)[None]
        cos, sin = self.drafter.rope(embeds, positions)
        q, k, v = layer.project(embeds, hidden, cos, sin)
        all_k = k if keys is None else torch.cat([keys, k], dim=2)
        all_v = v if values is None else torch.cat([values, v], dim=2)
        past = all_k.shape[2] - n
        mask = torch.ones(n, past + n, dtype=torch.bool, device=q.device).tril(diagonal=past)
        heads = q.shape[1]
        attended = F.scaled_dot_product_attention(q, expand_kv(all_k, heads), expand_kv(all_v, heads), attn_mask=mask)
        return self.drafter.fed_back(layer.finish(hidden, attended)), all_k, all_v

    @torch.no_grad()
    def append(self, aux: Tensor, next_tokens: Tensor) -> None:
        """Commit n verified positions p..p+n-1: ``aux[j]`` is the target's aux state [3·H_target]
        at p+j, ``next_tokens[j]`` the verified token at p+j+1. Drops the last proposal's scratch."""
        if aux.ndim != 2 or next_tokens.ndim != 1 or aux.shape[0] != next_tokens.shape[0]:
            raise ValueError(
                f"append needs aux [n, 3H] and next_tokens [n]; got {tuple(aux.shape)} and {tuple(next_tokens.shape)}"
            )
        if aux.shape[0] == 0:
            return
        d = self.drafter
        hidden = d.fuse(aux.to(d.fc.weight.device))[None]
        embeds = d.embed_tokens(next_tokens.to(d.fc.weight.device)[None]).to(hidden.dtype)
        out, self._keys, self._values = self._attend(embeds, hidden, self.length, self._keys, self._values)
        self.length += aux.shape[0]
        self._hidden = out[:, -1:]

    @torch.no_grad()
    def propose(self, k: int, temperature: float = 0.0) -> tuple[list[int], list[Tensor] | None]:
        """k target-vocabulary ids continuing the sequence after the last appended token, each
        step feeding the drafter's own hidden output; with temperature > 0 the tokens are
        sampled and each step's distribution over the target vocabulary (zero outside the
        draft vocabulary) comes back for speculative rejection sampling."""
        if self._hidden is None:
            raise RuntimeError("propose() needs at least one append() first")
        d = self.drafter
        hidden, keys, values = self._hidden, self._keys, self._values
        tokens: list[int] = []
        probs: list[Tensor] = []
        for step in range(k):
            logits = d.logits(hidden)[0, -1].float()
            if temperature > 0:
                draft_probs = torch.softmax(logits / temperature, dim=-1)
                draft_id = torch.multinomial(draft_probs, 1)[0]
                full = torch.zeros(d.spec.vocab_size, device=logits.device)
                full[d.to_target_ids(torch.arange(draft_probs.shape[0], device=logits.device))] = draft_probs
                probs.append(full)
            else:
                draft_id = logits.argmax()
            token = d.to_target_ids(draft_id)
            tokens.append(int(token))
            if step + 1 < k:
                embeds = d.embed_tokens(token.view(1, 1)).to(hidden.dtype)
                hidden, keys, values = self._attend(embeds, hidden, self.length + step, keys, values)
        return tokens, (probs if temperature > 0 else None)


@dataclass
class TargetHead:
    """What the loss needs from the target: its lm_head and the draft vocabulary."""

    lm_head: torch.Tensor
    used: torch.Tensor
    """[V_draft] target ids of the draft vocabulary, sorted."""
    t2d: torch.Tensor

    def targets(self, batch) -> Targets:
        return target_distribution(batch.final, self.lm_head, self.used, self.t2d, needed_positions(batch.loss_mask))


def batch_stats(forward, drafter, batch, head: TargetHead, steps: int, criterion: Criterion) -> list[StepStats]:
    """Unroll ``forward`` (the drafter or its DDP wrapper) over a batch; per-step sums."""
    targets = head.targets(batch)
    return ttt_stats(forward(batch.aux, batch.input_ids, steps), batch.loss_mask, targets, drafter.d2t, criterion)


@dataclass
class TTTObjective:
    """EAGLE-3's objective: the TTT unroll against the target's distribution, one score per step."""

    head: TargetHead
    steps: int
    criterion: Criterion = Criterion()

    @property
    def positions(self) -> int:
        return self.steps

    def stats(self, forward, drafter, batch, seeds: list[int]) -> list[StepStats]:
        return batch_stats(forward, drafter, batch, self.head, self.steps, self.criterion)


def sglang_config(spec: Eagle3Spec, dtype: torch.dtype) -> dict[str, Any]:
    """``config.json`` for SGLang and vLLM: each reads its own key, in its own numbering."""
    return {
        "architectures": [SGLANG_ARCH],
        **llama_keys(spec, dtype),
        "draft_vocab_size": spec.draft_vocab_size,
        "target_hidden_size": spec.target_hidden_size,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(spec.aux_layers), "use_aux_hidden_state": True},
        "eagle_aux_hidden_state_layer_ids": hf_hidden_state_indices(list(spec.aux_layers)),
        **switch_keys(spec),
    }


def switch_keys(spec: Eagle3Spec) -> dict[str, bool]:
    """The switches' top-level keys, where vLLM and llama.cpp's converter read them; written only
    when set, so an EAGLE-3 drafter's config is what it always was."""
    return {key: True for key in SWITCHES if getattr(spec, key)}


def is_speculators(config: dict[str, Any]) -> bool:
    """Whether ``config`` is in the speculators layout (exported by eyas or saved by speculators' trainer)."""
    return config["architectures"][0] in (SPECULATORS_ARCH, SPECULATORS_TRAINER_ARCH)


def switches_of(config: dict[str, Any]) -> dict[str, bool]:
    """The switches a drafter's ``config.json`` sets."""
    return {key: bool(config.get(key, False)) for key in SWITCHES}


def speculators_config(
    spec: Eagle3Spec, verifier: str, verifier_architectures: list[str], steps: int, dtype: torch.dtype
) -> dict[str, Any]:
    """``config.json`` in the speculators ``Eagle3Speculator`` layout (vLLM's layer numbering)."""
    return {
        "architectures": [SPECULATORS_ARCH],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {"architectures": ["LlamaForCausalLM"], **llama_keys(spec, dtype)},
        "draft_vocab_size": spec.draft_vocab_size,
        "norm_before_residual": spec.norm_before_residual,
        "target_hidden_size": spec.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": hf_hidden_state_indices(list(spec.aux_layers)),
        **switch_keys(spec),
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


class Eagle3(Family):
    """EAGLE-3: one layer, chain drafting, trained by training-time test over a reduced vocabulary."""

    name = "eagle3"
    title = "EAGLE-3"
    architectures = (SGLANG_ARCH, SPECULATORS_ARCH, SPECULATORS_TRAINER_ARCH)
    aux_layer_count = 3
    reads = frozenset({"ttt_steps", "step_weight", "draft_vocab_size", "eagle3"})
    formats = ("sglang", "vllm", "speculators", "gguf")
    vllm_method = "eagle3"
    llamacpp_arch = "eagle3"
    llamacpp_spec_type = "draft-eagle3"
    broken_control = True
    warm_starts = True

    def spec(self, base: DrafterSpec, config: RunConfig) -> Eagle3Spec:
        return Eagle3Spec(**base.sizes(), **config.train.eagle3.model_dump())

    def new(self, spec: Eagle3Spec, embedding: Tensor, lm_head: Tensor) -> Eagle3Drafter:
        return Eagle3Drafter(spec, embedding)

    def training(self, inputs: TrainingInputs) -> Training:
        cfg = inputs.config.train
        d2t, t2d = inputs.vocab()
        device = inputs.lm_head.device
        used = torch.arange(d2t.shape[0], device=device) + d2t.to(device)
        criterion = Criterion.of(cfg)
        return Training(
            spec=replace(self.spec(inputs.base, inputs.config), draft_vocab_size=d2t.shape[0]),
            objective=TTTObjective(TargetHead(inputs.lm_head, used, t2d.to(device)), cfg.ttt_steps, criterion),
            step_weights=criterion.fixed_weights([cfg.step_weight**k for k in range(cfg.ttt_steps)]),
            vocab=(d2t, t2d),
        )

    def session(self, drafter: Eagle3Drafter) -> DraftSession:
        return DraftSession(drafter)

    def config(self, spec: Eagle3Spec, dtype: torch.dtype) -> dict[str, Any]:
        return sglang_config(spec, dtype)

    def read_spec(self, config: dict[str, Any], path: Path, target_layers: int | None) -> Eagle3Spec:
        """SpecForge/SGLang-style (``eagle_config`` ids), vLLM-style (top-level ids only),
        speculators (eyas's export and speculators' own trainer's), and the original EAGLE-3
        releases (no ids: the default layers of a ``target_layers``-layer target)."""
        layers = aux_layers_of(config, path, target_layers)
        llama = config["transformer_layer_config"] if is_speculators(config) else config
        return Eagle3Spec(**sizes_from_keys(llama, config, layers).sizes(), **switches_of(config))

    def weights_from(self, config: dict[str, Any], weights: dict[str, Tensor]) -> dict[str, Tensor]:
        return from_speculators_keys(weights) if is_speculators(config) else weights

    def export(self, format, weights, spec, directory, dtype, verifier, steps) -> None:
        if format != "speculators":
            return super().export(format, weights, spec, directory, dtype, verifier, steps)
        name, architectures = verifier
        write_layout(
            to_speculators_keys(weights), speculators_config(spec, name, architectures, steps, dtype), directory, dtype
        )

    def readme(self, spec: DrafterSpec, format: str, directory: Path, target: str, steps: int, dtype: str) -> str:
        sections = [
            f"# EAGLE-3 drafter for `{target}`\n\n"
            f"Trained by eyas; layout `{format}`, weights in {dtype}. The token embedding is not included: "
            "servers share the target's.\n"
        ]
        if format == "speculators":
            # vLLM serves a speculators directory on its own: the verifier is named inside it.
            sections.append(f"## vLLM\n\n```bash\n{VLLM_SERVER} --model {directory} --dtype {dtype}\n```\n")
        else:
            if unread := [key for key in SGLANG_UNREAD if getattr(spec, key)]:
                sections.append(
                    f"## SGLang\n\nNot served as trained: SGLang's EAGLE-3 model does not read {', '.join(unread)}; "
                    "it would load this drafter without them and draft from states it was not trained on. Serve it in "
                    "vLLM (below) or llama.cpp (`eyas export CONFIG --format gguf`).\n"
                )
            else:
                sections.append(
                    "## SGLang\n\n```bash\n"
                    f"python -m sglang.launch_server --model-path {target} --dtype {dtype} \\\n"
                    f"  --speculative-algorithm EAGLE3 --speculative-draft-model-path {directory} \\\n"
                    f"  --speculative-num-steps {steps} --speculative-eagle-topk 1 "
                    f"--speculative-num-draft-tokens {steps + 1}\n```\n"
                )
            sections.append("## vLLM\n\n" + self.vllm_command(directory, target, steps, dtype))
        return "\n".join(sections)

    def left_out(self, train: TrainConfig) -> set[str]:
        """EAGLE-3 runs keep the fingerprint they had before other families existed (no
        ``train.drafter``), and EAGLE-3 as published the one it had before EAGLE-3.1 existed."""
        return {"drafter"} | ({"eagle3"} if train.eagle3 == Eagle3Config() else set())

    def options(self, spec: Eagle3Spec) -> dict[str, bool]:
        return switch_keys(spec)

    def configured_options(self, train: TrainConfig) -> list[str]:
        return [key for key in SWITCHES if getattr(train.eagle3, key)]


EAGLE3 = Eagle3()
