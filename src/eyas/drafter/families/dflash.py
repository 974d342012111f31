"""DFlash: a block-diffusion drafter that proposes a whole block in one forward pass; its model,
objective, in-process session and layout.

Shape (names are the exported weight names, z-lab's ``DFlashDraftModel`` layout that vLLM,
SGLang and llama.cpp's converter read):

- ``fc``: Linear(n·H_target → H) over the context features (the outputs of the target layers
  ``aux_layers``, concatenated), then ``hidden_norm``;
- ``layers.i``: Qwen3-style decoder layers (RMSNorm on each head's queries and keys). Queries
  come from the block only; keys and values are the block's own *and* the context's, both
  through the same ``k_proj``/``v_proj`` (the context skips ``input_layernorm``);
- ``norm``, then the target's own ``lm_head`` (``target_head`` here); the token embedding is the target's too. Neither
  is trained nor saved.

A block is ``[last committed token, mask × (block_size − 1)]`` at positions p..p+block_size−1;
it attends to every committed position < p and, non-causally, to all of itself. The output at
block position j predicts the token at p+j, so one pass drafts ``block_size − 1`` tokens.
Training (:meth:`DFlashDrafter.blocks`) and drafting (:class:`DFlashSession`) share
:meth:`DFlashLayer.context_kv` and :meth:`DFlashLayer.forward`, so they cannot drift apart.

The objective: blocks anchored at random answer positions, scored per block position.

Each sample gets up to ``train.dflash.anchors`` blocks, anchored (the block's committed token)
at positions a drawn without replacement from those whose next token is an answer token; each
sample's draw comes from a generator seeded by the step and the sample's index, so a resumed run
draws the same blocks and N data-parallel ranks draw what one process would. Block
position k predicts the token at a+k against the target's own distribution there (soft
``train.loss``, as EAGLE-3's, :mod:`eyas.drafter.criteria`); a position past the sample's end
or outside the answer carries no loss, and a sample with fewer candidates than anchors gets
empty blocks, masked out.

Accuracy is kept the way serving accepts a block: position k is *scored* only when positions
1..k-1 all matched the target's greedy token, and *correct* when it matches too. So accuracy k
is the chance draft k is accepted given the earlier ones were, and the simulated acceptance
length 1 + Σₖ Πᵢ≤ₖ accᵢ that EAGLE-3's evaluation reports is exact for these blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from eyas.config import ConfigError, DFlashConfig, RunConfig, TrainConfig
from eyas.drafter.criteria import Criterion
from eyas.drafter.family import Family, Training, TrainingInputs
from eyas.drafter.layout import llama_keys, sizes_from_keys
from eyas.drafter.loss import StepStats
from eyas.drafter.parts import DrafterWeights, attention_projections, expand_kv
from eyas.drafter.spec import DrafterSpec
from eyas.target import load_tokenizer, stop_token_ids

DFLASH_ARCH = "DFlashDraftModel"
OUTPUT_NORM_INIT = 0.1
"""Starting weight of the final norm. A fresh block position is little more than its input
embedding, which a tied target head (SmolLM2's) maps to a logit ~60 nats above the rest at that
very token; starting the norm small starts every prediction near uniform, and on the embedded
target a drafter overfits a sequence in about half the steps it takes from 1.0."""


@dataclass(frozen=True)
class DFlashSpec(DrafterSpec):
    """A drafter spec plus what makes it DFlash; ``aux_layers`` are the context-feature layers
    (any number) and ``draft_vocab_size`` is the target's (DFlash drafts over the full vocabulary)."""

    family = "dflash"
    num_layers: int = 1
    block_size: int = 4
    mask_token_id: int = 0

    def draft_length(self, wanted: int) -> int:
        """At most ``block_size − 1``: one block pass drafts that many and no more. An engine asked
        for more drafts the same tokens under another name (llama.cpp clamps with a warning), so
        eyas never asks."""
        return min(wanted, self.block_size - 1)


class DFlashLayer(nn.Module):
    def __init__(self, spec: DFlashSpec) -> None:
        super().__init__()
        h, d = spec.hidden_size, spec.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_attention_heads, spec.num_key_value_heads, d
        self.self_attn = attention_projections(spec, h)
        self.self_attn.q_norm = LlamaRMSNorm(d, eps=spec.rms_norm_eps)
        self.self_attn.k_norm = LlamaRMSNorm(d, eps=spec.rms_norm_eps)
        self.mlp = LlamaMLP(spec.llama_config())
        self.input_layernorm = LlamaRMSNorm(h, eps=spec.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=spec.rms_norm_eps)

    def _heads(self, x: Tensor, proj: nn.Linear, heads: int) -> Tensor:
        b, t, _ = x.shape
        return proj(x).view(b, t, heads, self.head_dim)

    def context_kv(self, context: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Rotated keys and values [B,kv_heads,T,d] of the fused context features [B,T,H]."""
        attn = self.self_attn
        k = attn.k_norm(self._heads(context, attn.k_proj, self.num_kv_heads)).transpose(1, 2)
        v = self._heads(context, attn.v_proj, self.num_kv_heads).transpose(1, 2)
        k, _ = apply_rotary_pos_emb(k, k, cos, sin)
        return k, v

    def forward(
        self, x: Tensor, context_k: Tensor, context_v: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None
    ) -> Tensor:
        """Block rows x [B,Q,H] attending to the context's keys/values then their own (``mask``
        [B,1,Q,T+Q] bool, None: everything visible)."""

        def attend(h: Tensor) -> Tensor:
            attn = self.self_attn
            q = attn.q_norm(self._heads(h, attn.q_proj, self.num_heads)).transpose(1, 2)
            k = attn.k_norm(self._heads(h, attn.k_proj, self.num_kv_heads)).transpose(1, 2)
            v = self._heads(h, attn.v_proj, self.num_kv_heads).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys = expand_kv(torch.cat([context_k, k], dim=2), self.num_heads)
            values = expand_kv(torch.cat([context_v, v], dim=2), self.num_heads)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            b, _, n, _ = out.shape
            return attn.o_proj(out.transpose(1, 2).reshape(b, n, -1))

        x = x + self.sublayer("attention", self.input_layernorm(x), attend)
        return x + self.sublayer("mlp", self.post_attention_layernorm(x), self.mlp)

    def sublayer(self, name: str, h: Tensor, run) -> Tensor:
        """Sublayer ``name`` (``attention``, ``mlp``) on its normed input ``h``: as it is here;
        DFlash2 convolves both sides inside each block."""
        return run(h)


class DFlashDrafter(DrafterWeights, nn.Module):
    """DFlash draft model; see the module docstring for the shape."""

    layer_type: type[DFlashLayer] = DFlashLayer

    def __init__(self, spec: DFlashSpec, embedding: Tensor | None = None, lm_head: Tensor | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.embed_tokens.requires_grad_(False)
        self.target_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.target_head.requires_grad_(False)
        if embedding is not None:
            self.set_target_parts(embedding, embedding if lm_head is None else lm_head)
        self.fc = nn.Linear(len(spec.aux_layers) * spec.target_hidden_size, spec.hidden_size, bias=False)
        self.hidden_norm = LlamaRMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.layers = nn.ModuleList(self.layer_type(spec) for _ in range(spec.num_layers))
        self.norm = LlamaRMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        with torch.no_grad():
            self.norm.weight.fill_(OUTPUT_NORM_INIT)
        self.rotary = LlamaRotaryEmbedding(spec.llama_config())

    def set_target_parts(self, embedding: Tensor, lm_head: Tensor) -> None:
        """The target's token embedding and output head (frozen; shared when dtype and device match)."""
        shape = (self.spec.vocab_size, self.spec.hidden_size)
        for name, weight in (("embedding", embedding), ("lm_head", lm_head)):
            if tuple(weight.shape) != shape:
                raise ValueError(f"target {name} is {tuple(weight.shape)}, the drafter needs {shape}")
        self.embed_tokens.weight = nn.Parameter(embedding.detach().to(torch.float32), requires_grad=False)
        self.target_head.weight = nn.Parameter(lm_head.detach().to(torch.float32), requires_grad=False)

    def context(self, features: Tensor) -> Tensor:
        """Fused context [B,T,H] from the target layers' outputs [B,T,n·H_target]."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def block_inputs(self, last_tokens: Tensor) -> Tensor:
        """Embedded blocks [B,N·block_size,H]: each of ``last_tokens`` [B,N] then mask tokens."""
        b, n = last_tokens.shape
        ids = torch.full((b, n, self.spec.block_size), self.spec.mask_token_id, device=last_tokens.device)
        ids[:, :, 0] = last_tokens
        return self.embed_tokens(ids.view(b, -1))

    def run_layers(self, x: Tensor, context: Tensor, context_pos: Tensor, block_pos: Tensor, mask) -> Tensor:
        """The layers over block rows x; returns the normed hidden states [B,Q,H]."""
        ctx_cos, ctx_sin = self.rotary(x, context_pos)
        cos, sin = self.rotary(x, block_pos)
        for layer in self.layers:
            k, v = layer.context_kv(context, ctx_cos, ctx_sin)
            x = layer(x, k, v, cos, sin, mask)
        return self.norm(x)

    def block_hidden(self, features: Tensor, input_ids: Tensor, anchors: Tensor) -> Tensor:
        """Training: the normed hidden states [B,N,block_size,H] of blocks anchored at ``anchors``
        [B,N] (position of each block's committed token; −1: no block), all in one pass. Block n
        sees the context before its anchor and the whole of itself, as in serving."""
        b, t = input_ids.shape
        n, size = anchors.shape[1], self.spec.block_size
        valid = anchors >= 0
        start = anchors.clamp(min=0)
        x = self.block_inputs(input_ids.gather(1, start))
        offsets = torch.arange(size, device=anchors.device)
        block_pos = (start[..., None] + offsets).view(b, n * size)
        context_pos = torch.arange(t, device=anchors.device).expand(b, t)
        sees_context = context_pos[:, None, :] < start.repeat_interleave(size, dim=1)[..., None]
        sees_context &= valid.repeat_interleave(size, dim=1)[..., None]
        block_of = torch.arange(n, device=anchors.device).repeat_interleave(size)
        sees_block = (block_of[:, None] == block_of[None, :]).expand(b, -1, -1)
        mask = torch.cat([sees_context, sees_block], dim=-1)[:, None]
        hidden = self.run_layers(x, self.context(features), context_pos, block_pos, mask)
        return hidden.view(b, n, size, -1)

    def blocks(self, features: Tensor, input_ids: Tensor, anchors: Tensor) -> Tensor:
        """Training: draft logits [B,N,block_size−1,V]; block position k ≥ 1 predicts the token at a+k."""
        return project(self.target_head, self.block_hidden(features, input_ids, anchors)[:, :, 1:])

    def forward(self, features: Tensor, input_ids: Tensor, anchors: Tensor) -> Tensor:
        """:meth:`blocks` (what DDP wraps)."""
        return self.blocks(features, input_ids, anchors)


class DFlashSession:
    """Block drafting for one sequence (batch 1), as llama.cpp's ``draft-dflash`` runs it: the
    context keys/values of committed positions are kept per layer; each proposal runs one block."""

    def __init__(self, drafter: DFlashDrafter) -> None:
        self.drafter = drafter
        self.length = 0
        """Committed positions whose context features are in the cache."""
        self.last_token: int | None = None
        self._kv: list[tuple[Tensor, Tensor]] = []

    @torch.no_grad()
    def append(self, features: Tensor, next_tokens: Tensor) -> None:
        """Commit n positions p..p+n−1: ``features[j]`` the target layers' outputs at p+j,
        ``next_tokens[j]`` the token at p+j+1 (the last one anchors the next block)."""
        if features.shape[0] == 0:
            return
        d = self.drafter
        context = d.context(features.to(d.fc.weight.device)[None])
        positions = torch.arange(self.length, self.length + features.shape[0], device=context.device)[None]
        cos, sin = d.rotary(context, positions)
        new = [layer.context_kv(context, cos, sin) for layer in d.layers]
        self._kv = (
            new
            if not self._kv
            else [(torch.cat([k0, k], 2), torch.cat([v0, v], 2)) for (k0, v0), (k, v) in zip(self._kv, new)]
        )
        self.length += features.shape[0]
        self.last_token = int(next_tokens[-1])

    @torch.no_grad()
    def block_hidden(self) -> Tensor:
        """The normed hidden states [block_size, H] of one block pass after the committed positions."""
        if self.last_token is None:
            raise RuntimeError("propose() needs at least one append() first")
        d = self.drafter
        device = d.fc.weight.device
        x = d.block_inputs(torch.tensor([[self.last_token]], device=device))
        cos, sin = d.rotary(x, torch.arange(self.length, self.length + d.spec.block_size, device=device)[None])
        for layer, (ck, cv) in zip(d.layers, self._kv):
            x = layer(x, ck, cv, cos, sin, None)
        return d.norm(x)[0]

    def block_logits(self, k: int) -> Tensor:
        """Logits [min(k, block_size − 1), V] of one block pass after the committed positions."""
        return self.drafter.target_head(self.block_hidden()[1 : 1 + self.drafter.spec.draft_length(k)])

    def propose(self, k: int, temperature: float = 0.0) -> tuple[list[int], None]:
        """Up to min(k, block_size − 1) greedy drafts from one block pass (engines draft DFlash
        blocks greedily at any temperature; verification treats them as one-hot)."""
        return self.block_logits(k).argmax(-1).tolist(), None


def sample_anchors(loss_mask: torch.Tensor, count: int, seeds: list[int]) -> torch.Tensor:
    """[B,count] anchor positions (−1: no block): positions a whose token a+1 is an answer token,
    row r's drawn with seed ``seeds[r]``."""
    candidates = F.pad(loss_mask[:, 1:], (0, 1), value=False).cpu()
    anchors = torch.full((loss_mask.shape[0], count), -1, dtype=torch.long)
    for row, (allowed, seed) in enumerate(zip(candidates, seeds)):
        where = allowed.nonzero().flatten()
        generator = torch.Generator().manual_seed(seed)
        picked = where[torch.randperm(where.numel(), generator=generator)[:count]]
        anchors[row, : picked.numel()] = picked.sort().values
    return anchors.to(loss_mask.device)


def decay_weights(positions: int, gamma: float) -> list[float]:
    """exp(−j/γ) for the j-th drafted position of a block, j = 0..positions−1 (DFlash's
    exp(−(k−1)/γ) for block positions k = 1..block_size−1; DSpark's exp(−k/γ), k = 0..block_size−1)."""
    return [math.exp(-j / gamma) for j in range(positions)]


@dataclass
class BlockObjective:
    """What :func:`eyas.train.loop.train_step` and evaluation ask of a DFlash drafter."""

    anchors: int
    block_size: int
    criterion: Criterion = Criterion()

    @property
    def positions(self) -> int:
        return self.block_size - 1

    def stats(self, forward, drafter, batch, seeds: list[int]) -> list[StepStats]:
        """Per block position sums over the batch; ``seeds``: one per sample, for its anchors."""
        anchors = sample_anchors(batch.loss_mask, self.anchors, seeds)
        logits = forward(batch.aux, batch.input_ids, anchors)
        answer, target_logits = block_labels(batch, anchors, self.positions, drafter.target_head.weight)
        loss, confidence = self.criterion.score(torch.log_softmax(target_logits, dim=-1), logits)
        hits = (logits.argmax(-1) == target_logits.argmax(-1)) & answer
        return block_stats(self.criterion.weigh(loss, confidence, answer), answer, hits, answer)


def project(head: nn.Linear, hidden: Tensor) -> Tensor:
    """``head(hidden)`` for ``hidden`` [..., H] as one 2-D matrix product. ``nn.Linear`` on a strided
    N-D slice (a block's positions after the first) runs a batched kernel that is about 12× slower
    on a CPU, forward and backward (2.0 s against 0.17 s for 192 positions × 49,152 ids), and the
    head over the full vocabulary is most of a block family's step."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    return head(flat).view(*hidden.shape[:-1], -1)


def block_tokens(input_ids: Tensor, anchors: Tensor, count: int) -> Tensor:
    """[B,N,count] the tokens at a … a+count−1 of the blocks anchored at ``anchors`` [B,N] (the
    last token where a block runs past its sample): what a block's positions follow, teacher-forced."""
    where = anchors.clamp(min=0)[..., None] + torch.arange(count, device=anchors.device)
    where = where.clamp(max=input_ids.shape[1] - 1)
    return input_ids.gather(1, where.view(input_ids.shape[0], -1)).view_as(where)


def block_labels(batch, anchors: Tensor, count: int, head: Tensor) -> tuple[Tensor, Tensor]:
    """What the blocks anchored at ``anchors`` [B,N] predict, the tokens at a+1 … a+count: whether
    each is an answer token inside its sample [B,N,count], and the target's logits for it
    [B,N,count,V] (float32, no gradient) from its final state one position earlier, through ``head``."""
    b, t = batch.input_ids.shape
    where = anchors.clamp(min=0)[..., None] + torch.arange(1, count + 1, device=anchors.device)
    inside = (anchors[..., None] >= 0) & (where < t)
    where = where.clamp(max=t - 1)
    answer = batch.loss_mask.gather(1, where.view(b, -1)).view_as(where) & inside
    with torch.no_grad():
        final = batch.final.gather(1, (where - 1).view(b, -1, 1).expand(-1, -1, batch.final.shape[-1]))
        target_logits = (final.to(head.dtype) @ head.T).float().view(*where.shape, -1)
    return answer, target_logits


def block_stats(loss: Tensor, trained: Tensor, hits: Tensor, answer: Tensor) -> list[StepStats]:
    """Per block position sums: ``loss`` where ``trained``, and accuracy the way serving accepts a
    block — position k scored only when every earlier position hit."""
    accepted_before = F.pad(hits.long().cumprod(-1), (1, 0), value=1)[..., :-1].bool()
    return [
        StepStats(
            loss_sum=torch.where(trained[..., k], loss[..., k], 0.0).sum(),
            loss_count=trained[..., k].sum(),
            correct=(hits[..., k] & accepted_before[..., k]).sum(),
            scored=(answer[..., k] & accepted_before[..., k]).sum(),
        )
        for k in range(loss.shape[-1])
    ]


def dflash_config(spec: DFlashSpec, dtype: torch.dtype) -> dict[str, Any]:
    """``config.json`` of z-lab's ``DFlashDraftModel`` layout. ``target_layer_ids`` are output-layer
    ids (0-based), the numbering vLLM and SGLang read and llama.cpp's converter shifts by one."""
    settings = {
        "mask_token_id": spec.mask_token_id,
        "target_layer_ids": list(spec.aux_layers),
        "block_size": spec.block_size,
    }
    return {
        "architectures": [DFLASH_ARCH],
        **llama_keys(spec, dtype),
        "model_type": "qwen3",
        "num_hidden_layers": spec.num_layers,
        "target_hidden_size": spec.target_hidden_size,
        "block_size": spec.block_size,
        "dflash_config": settings,
    }


def dflash_spec(base: DrafterSpec, cfg: DFlashConfig, mask_token_id: int, section: str = "train.dflash") -> DFlashSpec:
    """``base`` (sizes from the target and ``train.*``) as a DFlash spec over the full vocabulary
    (``cfg``: ``train.dflash``, or the ``section`` of another family with its block settings)."""
    if not 0 <= mask_token_id < base.vocab_size:
        raise ConfigError(f"{section}.mask_token_id: {mask_token_id} is outside the target's {base.vocab_size} ids")
    return DFlashSpec(
        **(base.sizes() | {"draft_vocab_size": base.vocab_size}),
        num_layers=cfg.layers,
        block_size=cfg.block_size,
        mask_token_id=mask_token_id,
    )


def default_mask_token(tokenizer, stop_ids: set[int]) -> int:
    """The tokenizer's mask token, else its highest-id special token that no sequence needs
    (not a stop, BOS or pad token): the engines embed the mask with the target's own row, and
    such a token never occurs in the text the drafter reads, so its row means nothing else."""
    if tokenizer.mask_token_id is not None:
        return int(tokenizer.mask_token_id)
    needed = stop_ids | {tokenizer.bos_token_id, tokenizer.pad_token_id}
    special = [i for i, t in tokenizer.added_tokens_decoder.items() if t.special and i not in needed]
    if not special:
        raise ConfigError(
            "train.dflash.mask_token_id: the tokenizer has no mask token and no spare special token; name one"
        )
    return max(special)


class DFlash(Family):
    """DFlash: a block of drafts from one forward pass, conditioned on the target's context features."""

    name = "dflash"
    title = "DFlash"
    architectures = (DFLASH_ARCH,)
    aux_layer_count = None
    reads = frozenset({"dflash"})
    formats = ("sglang", "vllm", "gguf")
    vllm_method = "dflash"
    llamacpp_arch = "dflash"
    llamacpp_spec_type = "draft-dflash"
    drafter_type: type[DFlashDrafter] = DFlashDrafter

    def spec(self, base: DrafterSpec, config: RunConfig) -> DFlashSpec:
        """Over the full vocabulary, with the mask token the config names or the tokenizer's default."""
        cfg = config.train.dflash
        return dflash_spec(base, cfg, self.mask_token(cfg, config))

    def mask_token(self, cfg: DFlashConfig, config: RunConfig) -> int:
        """``cfg.mask_token_id``, else the tokenizer's default (:func:`default_mask_token`)."""
        if cfg.mask_token_id is not None:
            return cfg.mask_token_id
        tokenizer = load_tokenizer(config.target)
        return default_mask_token(tokenizer, stop_token_ids(tokenizer))

    def new(self, spec: DFlashSpec, embedding: Tensor, lm_head: Tensor) -> DFlashDrafter:
        return self.drafter_type(spec, embedding, lm_head)

    def training(self, inputs: TrainingInputs) -> Training:
        cfg = getattr(inputs.config.train, self.name)
        criterion = Criterion.of(inputs.config.train)
        return Training(
            spec=self.spec(inputs.base, inputs.config),
            objective=self.objective(cfg, criterion),
            step_weights=criterion.fixed_weights(decay_weights(cfg.block_size - 1, cfg.decay)),
        )

    def objective(self, cfg: DFlashConfig, criterion: Criterion) -> BlockObjective:
        """How a batch is scored, from the family's own ``train.<name>`` section and the run's criterion."""
        return BlockObjective(cfg.anchors, cfg.block_size, criterion)

    def session(self, drafter: DFlashDrafter) -> DFlashSession:
        return DFlashSession(drafter)

    def config(self, spec: DFlashSpec, dtype: torch.dtype) -> dict[str, Any]:
        return dflash_config(spec, dtype)

    def read_spec(self, config: dict[str, Any], path: Path, target_layers: int | None) -> DFlashSpec:
        settings = config["dflash_config"]
        return DFlashSpec(
            **sizes_from_keys(config, config, settings["target_layer_ids"]).sizes(),
            num_layers=config["num_hidden_layers"],
            block_size=settings.get("block_size", config.get("block_size")),
            mask_token_id=settings["mask_token_id"],
        )

    def readme(self, spec: DrafterSpec, format: str, directory: Path, target: str, steps: int, dtype: str) -> str:
        """One layout (z-lab's ``DFlashDraftModel``) that SGLang and vLLM both read."""
        return "\n".join(
            [
                f"# DFlash drafter for `{target}`\n\nTrained by eyas; weights in {dtype}. The token embedding and "
                "output head are not included: servers share the target's.\n",
                "## SGLang\n\n```bash\n"
                f"python -m sglang.launch_server --model-path {target} --dtype {dtype} \\\n"
                f"  --speculative-algorithm DFLASH --speculative-draft-model-path {directory}\n```\n",
                "## vLLM\n\n" + self.vllm_command(directory, target, steps, dtype),
            ]
        )

    def lr(self, train: TrainConfig) -> float:
        own = getattr(train, self.name).lr
        return train.lr if own is None else own

    def left_out(self, train: TrainConfig) -> set[str]:
        """``train.lr`` when the family's own section (``train.dflash``, ``train.dspark``) sets
        the rate it trains at."""
        return {"lr"} if getattr(train, self.name).lr is not None else set()


DFLASH = DFlash()
