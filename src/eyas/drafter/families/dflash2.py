"""DFlash2: DFlash's block drafter plus convolutions inside the block and a candidate selector,
as z-lab defines it (``DFlash2DraftModel``), speculators (PR 1006) trains it and llama.cpp's
``draft-dflash`` serves it.

Shape (names are the exported weight names, z-lab's layout that llama.cpp's converter and vLLM's
``qwen3_dflash2`` read):

- the DFlash backbone (:mod:`eyas.drafter.families.dflash`): ``fc``, ``hidden_norm``, Qwen3-style
  ``layers.i``, ``norm``, the target's embedding and head, the block ``[last committed token,
  mask, …]`` whose position k ≥ 1 drafts the token at a+k;
- in each layer, ``attention_conv`` and ``mlp_conv``: a grouped dynamic causal convolution on
  the sublayer's normed input and on its output. Each is ``out[k] = Σ_t w_k,t ⊙ x[k−t]`` over taps
  t < ``conv_kernel_size``, inside the block only (zero before its first position), with
  ``w_k,t = base_kernel[side, t] + kernel_projection(x_normed[k])[side, t, group]``: a learned
  kernel per channel plus a coefficient per group of ``conv_group_size`` channels that the
  position's normed input sets; both sides' coefficients come from the one projection of the
  sublayer's input. They start as the identity (tap 0 = 1, projection 0), that is, as DFlash;
- ``candidate_selector``: position k's unary logits (the target head's) pick their top
  ``selector_top_k`` candidates c, each scored ``logit(c) + ⟨predecessor_codebook[prev] ⊙
  hidden_projection(h_k), successor_codebook[c]⟩``, ``prev`` the token at a+k−1. Drafting walks
  the block greedily: ``prev`` is the anchor at k = 1, then each position's pick (one block pass;
  only the small selector walks). Training teacher-forces ``prev`` with the true token.
  ``llama-server --spec-draft-p-min`` compares the softmax of the pick's score over the K.

The objective (speculators', whose authors say z-lab published none): eyas's DFlash loss on the
unary logits — soft cross-entropy against the target's distribution — plus ``selector_weight``
times a K-way cross-entropy of the selector's scores toward the target's greedy token, over the
unary top K; where that token is not among them it replaces the weakest, so the label is
defined (serving would miss it: such a position counts as wrong in the accuracy). Both terms
carry DFlash's per-position weight exp(−(k−1)/γ).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eyas.config import ConfigError, DFlash2Config, RunConfig
from eyas.drafter.criteria import Criterion
from eyas.drafter.families.dflash import (
    BlockObjective,
    DFlash,
    DFlashDrafter,
    DFlashLayer,
    DFlashSession,
    DFlashSpec,
    block_labels,
    block_stats,
    block_tokens,
    dflash_config,
    dflash_spec,
    project,
    sample_anchors,
)
from eyas.drafter.spec import DrafterSpec

DFLASH2_ARCH = "DFlash2DraftModel"
OWN_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
"""What ``dflash_config`` holds beyond DFlash's: the keys llama.cpp's converter and vLLM read."""
INIT_STD = 0.02
"""Standard deviation of the selector's starting weights (z-lab's, the targets' initializer range)."""


@dataclass(frozen=True)
class DFlash2Spec(DFlashSpec):
    """A DFlash spec plus the convolutions' taps and groups and the selector's rank and K."""

    family = "dflash2"
    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 256
    selector_top_k: int = 16


class BlockConv(nn.Module):
    """One sublayer's pair of grouped dynamic causal convolutions (see the module docstring)."""

    def __init__(self, spec: DFlash2Spec) -> None:
        super().__init__()
        h = spec.hidden_size
        self.block_size, self.taps, self.group_size = spec.block_size, spec.conv_kernel_size, spec.conv_group_size
        self.groups = h // self.group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, self.taps, h))
        self.kernel_projection = nn.Linear(h, 2 * self.taps * self.groups, bias=False)
        with torch.no_grad():
            self.base_kernel[:, 0] = 1.0
            self.kernel_projection.weight.zero_()

    def coefficients(self, h: Tensor) -> Tensor:
        """[B,Q,2,taps,groups]: both sides' per-position coefficients, from the normed input ``h``."""
        return self.kernel_projection(h).unflatten(-1, (2, self.taps, self.groups))

    def forward(self, x: Tensor, coefficients: Tensor, side: int) -> Tensor:
        """``x`` [B,Q,H], Q a whole number of blocks, convolved inside each block with ``side``'s kernels."""
        b, q, h = x.shape
        shape = (b, q // self.block_size, self.block_size, self.groups, self.group_size)
        blocks, dynamic = x.view(shape), coefficients[:, :, side].reshape(*shape[:3], self.taps, self.groups)
        out = torch.zeros_like(blocks)
        for tap in range(min(self.taps, self.block_size)):
            shifted = F.pad(blocks, (0, 0, 0, 0, tap, 0))[:, :, : self.block_size]
            weight = self.base_kernel[side, tap].view(self.groups, self.group_size) + dynamic[..., tap, :, None]
            out = out + weight * shifted
        return out.view(b, q, h)


class DFlash2Layer(DFlashLayer):
    """A DFlash layer with :class:`BlockConv` on both sides of attention and of the MLP."""

    def __init__(self, spec: DFlash2Spec) -> None:
        super().__init__(spec)
        self.attention_conv = BlockConv(spec)
        self.mlp_conv = BlockConv(spec)

    def sublayer(self, name: str, h: Tensor, run) -> Tensor:
        conv = self.attention_conv if name == "attention" else self.mlp_conv
        coefficients = conv.coefficients(h)
        return conv(run(conv(h, coefficients, 0)), coefficients, 1)


class CandidateSelector(nn.Module):
    """Reranks a position's unary top K by a low-rank score of (previous token, hidden state, candidate)."""

    def __init__(self, spec: DFlash2Spec) -> None:
        super().__init__()
        self.predecessor_codebook = nn.Parameter(torch.randn(spec.vocab_size, spec.selector_rank) * INIT_STD)
        self.successor_codebook = nn.Parameter(torch.randn(spec.vocab_size, spec.selector_rank) * INIT_STD)
        self.hidden_projection = nn.Linear(spec.hidden_size, spec.selector_rank, bias=False)
        nn.init.normal_(self.hidden_projection.weight, std=INIT_STD)

    def forward(self, logits: Tensor, hidden: Tensor, prev_ids: Tensor, candidates: Tensor) -> Tensor:
        """Scores [..,K] of ``candidates`` [..,K] at positions with unary ``logits`` [..,V], normed
        ``hidden`` [..,H], after the tokens ``prev_ids`` [..]: what training and drafting both compute."""
        context = self.predecessor_codebook[prev_ids] * self.hidden_projection(hidden)
        transition = (self.successor_codebook[candidates] * context.unsqueeze(-2)).sum(-1)
        return logits.gather(-1, candidates) + transition


def training_candidates(logits: Tensor, targets: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The unary top ``k`` of ``logits`` [..,V] with ``targets`` [..] put in place of the weakest
    where absent; each target's index among them; whether it was among the unary top k (what
    serving reranks)."""
    candidates = logits.detach().topk(k, dim=-1).indices
    served = (candidates == targets[..., None]).any(-1)
    candidates[..., -1] = torch.where(served, candidates[..., -1], targets)
    label = (candidates == targets[..., None]).int().argmax(-1)
    return candidates, label, served


class DFlash2Drafter(DFlashDrafter):
    """DFlash2 draft model; see the module docstring for the shape."""

    layer_type = DFlash2Layer

    def __init__(self, spec: DFlash2Spec, embedding: Tensor | None = None, lm_head: Tensor | None = None) -> None:
        super().__init__(spec, embedding, lm_head)
        self.candidate_selector = CandidateSelector(spec)

    def blocks(self, features: Tensor, input_ids: Tensor, anchors: Tensor, targets: Tensor):
        """Training: unary logits [B,N,block_size−1,V], the selector's scores [B,N,block_size−1,K]
        of each position's :func:`training_candidates` toward ``targets`` (the target's greedy
        tokens) after the true token before it, the targets' indices among them, and whether
        serving would have had them."""
        hidden = self.block_hidden(features, input_ids, anchors)[:, :, 1:]
        logits = project(self.target_head, hidden)
        prev = block_tokens(input_ids, anchors, hidden.shape[2])
        candidates, label, served = training_candidates(logits, targets, self.spec.selector_top_k)
        return logits, self.candidate_selector(logits, hidden, prev, candidates), label, served

    def forward(self, features: Tensor, input_ids: Tensor, anchors: Tensor, targets: Tensor):
        """:meth:`blocks` (what DDP wraps)."""
        return self.blocks(features, input_ids, anchors, targets)


class DFlash2Session(DFlashSession):
    """Block drafting for one sequence, as llama.cpp's ``draft-dflash`` runs a DFlash2 drafter:
    one block pass, then the selector's greedy walk from the anchor."""

    @torch.no_grad()
    def propose(self, k: int, temperature: float = 0.0) -> tuple[list[int], None]:
        """Up to min(k, block_size − 1) greedy drafts at any temperature (the engines walk the
        selector's argmax; verification treats the drafts as one-hot)."""
        d = self.drafter
        hidden = self.block_hidden()[1 : 1 + d.spec.draft_length(k)]
        logits = d.target_head(hidden)
        candidates = logits.topk(d.spec.selector_top_k, dim=-1).indices
        prev = torch.tensor(self.last_token, device=hidden.device)
        drafts = []
        for i in range(hidden.shape[0]):
            scores = d.candidate_selector(logits[i], hidden[i], prev, candidates[i])
            prev = candidates[i, scores.argmax()]
            drafts.append(int(prev))
        return drafts, None


@dataclass
class SelectorObjective(BlockObjective):
    """DFlash's block objective plus the selector's K-way cross-entropy (see the module docstring)."""

    selector_weight: float = 1.0

    def stats(self, forward, drafter, batch, seeds: list[int]):
        anchors = sample_anchors(batch.loss_mask, self.anchors, seeds)
        answer, target_logits = block_labels(batch, anchors, self.positions, drafter.target_head.weight)
        greedy = target_logits.argmax(-1)
        logits, scores, label, served = forward(batch.aux, batch.input_ids, anchors, greedy)
        unary, confidence = self.criterion.score(torch.log_softmax(target_logits, dim=-1), logits)
        selector = F.cross_entropy(scores.float().flatten(0, -2), label.flatten(), reduction="none")
        loss = self.criterion.weigh(unary + self.selector_weight * selector.view_as(label), confidence, answer)
        hits = served & (scores.argmax(-1) == label) & answer
        return block_stats(loss, answer, hits, answer)


class DFlash2(DFlash):
    """DFlash2: DFlash's block with convolutions inside it and a candidate selector over its top K."""

    name = "dflash2"
    title = "DFlash2"
    architectures = (DFLASH2_ARCH,)
    reads = frozenset({"dflash2"})
    formats = ("sglang", "vllm", "gguf")
    vllm_method = "dflash"
    """vLLM serves a ``DFlash2DraftModel`` under the ``dflash`` method, in its GPU model runner only."""
    vllm_gpu_only = True
    drafter_type = DFlash2Drafter

    def spec(self, base: DrafterSpec, config: RunConfig) -> DFlash2Spec:
        cfg = config.train.dflash2
        block = dflash_spec(base, cfg, self.mask_token(cfg, config), "train.dflash2")
        h = block.hidden_size
        if h % cfg.conv_group_size:
            raise ConfigError(f"train.dflash2.conv_group_size: {cfg.conv_group_size} does not divide hidden size {h}")
        if cfg.selector_top_k * (cfg.selector_top_k + 1) > h:
            raise ConfigError(
                f"train.dflash2.selector_top_k: llama.cpp packs K·(K+1) selector scores into a hidden state of {h}; "
                f"K = {cfg.selector_top_k} needs {cfg.selector_top_k * (cfg.selector_top_k + 1)}"
            )
        return DFlash2Spec(**vars(block), **{k: getattr(cfg, k) for k in OWN_KEYS})

    def objective(self, cfg: DFlash2Config, criterion: Criterion) -> SelectorObjective:
        return SelectorObjective(cfg.anchors, cfg.block_size, criterion, cfg.selector_weight)

    def session(self, drafter: DFlash2Drafter) -> DFlash2Session:
        return DFlash2Session(drafter)

    def config(self, spec: DFlash2Spec, dtype: torch.dtype) -> dict[str, Any]:
        """z-lab's layout: DFlash's keys, with the convolutions' and selector's in ``dflash_config``."""
        config = dflash_config(spec, dtype)
        own = {k: getattr(spec, k) for k in OWN_KEYS}
        return {**config, "architectures": [DFLASH2_ARCH], "dflash_config": {**config["dflash_config"], **own}}

    def read_spec(self, config: dict[str, Any], path: Path, target_layers: int | None) -> DFlash2Spec:
        settings = config["dflash_config"]
        return DFlash2Spec(
            **vars(super().read_spec(config, path, target_layers)),
            **{k: settings[k] for k in OWN_KEYS},
        )

    def readme(self, spec: DrafterSpec, format: str, directory: Path, target: str, steps: int, dtype: str) -> str:
        """z-lab's ``DFlash2DraftModel`` layout; vLLM runs it in its GPU model runner only."""
        return "\n".join(
            [
                f"# DFlash2 drafter for `{target}`\n\nTrained by eyas; weights in {dtype}; z-lab's "
                "`DFlash2DraftModel` layout. The token embedding and output head are not included: servers "
                "share the target's.\n",
                "## vLLM (GPU)\n\nvLLM runs DFlash2 drafters in its GPU model runner only: its CPU build refuses "
                "them.\n\n" + self.vllm_command(directory, target, steps, dtype),
                "## SGLang\n\nNo SGLang release eyas has checked serves DFlash2 (its support is pull request "
                "sgl-project/sglang#35371).\n",
                "## llama.cpp\n\n`eyas export CONFIG --format gguf` writes the GGUF file and its `llama-server` command.\n",
            ]
        )


DFLASH2 = DFlash2()
