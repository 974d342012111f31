"""DSpark: DFlash's block drafter plus a low-rank Markov head and a confidence head, as
DeepSpec (deepseek-ai/DeepSpec) defines it and llama.cpp's ``draft-dspark`` serves it.

Shape (names are the exported weight names, DeepSpec's ``Qwen3DSparkModel`` layout):

- the DFlash backbone unchanged (``fc``, ``hidden_norm``, Qwen3-style ``layers.i``, ``norm``;
  :mod:`eyas.drafter.families.dflash`), over the same block ``[last committed token, mask, …]``
  and the same context;
- but block position k = 0 … block_size−1 predicts the token after a+k (DeepSpec's
  ``sample_from_anchor``), so one pass drafts ``block_size`` tokens, one more than DFlash;
- ``markov_head``: ``markov_w1`` (Embedding, target vocabulary × R) and ``markov_w2`` (Linear
  R → draft vocabulary): position k's logits are ``head(h_k) + markov_w2(markov_w1[prev_k])``,
  ``prev_k`` the token at a+k — the true one in training (teacher forcing, as DeepSpec trains),
  the drafted one when drafting (a greedy chain across the block, as llama.cpp runs it);
- ``confidence_head.proj`` (Linear H+R → 1, optional): sigmoid of it over ``[h_k ; markov_w1[prev_k]]``
  predicts whether position k's draft is accepted. Its target is DeepSpec's: the acceptance
  rate 1 − ½‖p_draft − p_target‖₁ of that position, detached, by binary cross-entropy;
  ``llama-server --spec-draft-p-min`` cuts a block at the first position below the threshold;
- a reduced draft vocabulary (``train.draft_vocab_size``, counted from the answers as EAGLE-3's)
  with ``d2t``/``t2d``; its ``lm_head`` holds the target head's rows of the draft ids, frozen
  (the full-vocabulary drafter reads the target's head, as DFlash). The engines map draft ids
  to target ids with ``d2t``, which llama.cpp's DSpark converter reads (its DFlash one does not).

The loss is eyas's DFlash objective over the draft vocabulary — soft cross-entropy against the
target's distribution restricted to it (DeepSpec mixes hard cross-entropy with an L1 distance
between the two distributions; speculators trains against the distribution, as eyas does) —
weighted exp(−k/γ) per position, plus the confidence head's loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eyas.config import DSparkConfig, RunConfig
from eyas.drafter.criteria import Criterion, tv
from eyas.drafter.families.dflash import (
    DFlash,
    DFlashDrafter,
    DFlashSession,
    DFlashSpec,
    block_labels,
    block_stats,
    block_tokens,
    decay_weights,
    dflash_config,
    dflash_spec,
    project,
    sample_anchors,
)
from eyas.drafter.family import Training, TrainingInputs
from eyas.drafter.spec import DrafterSpec
from eyas.drafter.vocab import draft_vocab_size

DSPARK_ARCH = "Qwen3DSparkModel"


@dataclass(frozen=True)
class DSparkSpec(DFlashSpec):
    """A DFlash spec plus the Markov head's rank, whether there is a confidence head, and a draft
    vocabulary that may be smaller than the target's."""

    family = "dspark"
    markov_rank: int = 256
    confidence_head: bool = True

    @property
    def reduced(self) -> bool:
        return self.draft_vocab_size < self.vocab_size

    def draft_length(self, wanted: int) -> int:
        """At most ``block_size``: every block position drafts."""
        return min(wanted, self.block_size)


class MarkovHead(nn.Module):
    def __init__(self, spec: DSparkSpec) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(spec.vocab_size, spec.markov_rank)
        self.markov_w2 = nn.Linear(spec.markov_rank, spec.draft_vocab_size, bias=False)
        with torch.no_grad():
            self.markov_w1.weight.normal_(0.0, 0.02)
            self.markov_w2.weight.zero_()  # start as DFlash: no bias until it is learned


class DSparkDrafter(DFlashDrafter):
    """DSpark draft model; see the module docstring for the shape."""

    def __init__(self, spec: DSparkSpec, embedding: Tensor | None = None, lm_head: Tensor | None = None) -> None:
        super().__init__(spec, embedding, lm_head)
        h, r = spec.hidden_size, spec.markov_rank
        self.markov_head = MarkovHead(spec)
        if spec.confidence_head:
            self.confidence_head = nn.Module()
            self.confidence_head.proj = nn.Linear(h + r, 1)
        if spec.reduced:
            self.lm_head = nn.Linear(h, spec.draft_vocab_size, bias=False)
            self.lm_head.requires_grad_(False)
            self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(spec.vocab_size, dtype=torch.bool))

    def set_vocab(self, d2t: Tensor, t2d: Tensor) -> None:
        """The draft vocabulary, and its rows of the target's head as ``lm_head``."""
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)
        with torch.no_grad():
            self.lm_head.weight.copy_(self.target_head.weight[self.draft_ids()])

    def draft_ids(self) -> Tensor:
        """[V_draft] the target id of each draft id."""
        ids = torch.arange(self.spec.draft_vocab_size, device=self.target_head.weight.device)
        return ids + self.d2t if self.spec.reduced else ids

    def to_target_ids(self, draft_ids: Tensor) -> Tensor:
        return draft_ids + self.d2t[draft_ids] if self.spec.reduced else draft_ids

    def position_logits(self, hidden: Tensor, prev_ids: Tensor) -> tuple[Tensor, Tensor | None]:
        """Draft-vocabulary logits and confidence logits (None without the head) of block
        positions with normed hidden states ``hidden`` [..,H] after the tokens ``prev_ids`` [..]
        (target ids): what training and drafting both compute."""
        head = self.lm_head if self.spec.reduced else self.target_head
        markov = self.markov_head.markov_w1(prev_ids)
        logits = project(head, hidden) + self.markov_head.markov_w2(markov)
        if not self.spec.confidence_head:
            return logits, None
        return logits, self.confidence_head.proj(torch.cat([hidden, markov], dim=-1)).squeeze(-1)

    def blocks(self, features: Tensor, input_ids: Tensor, anchors: Tensor) -> tuple[Tensor, Tensor | None]:
        """Training: logits [B,N,block_size,V_draft] and confidence logits [B,N,block_size] of the
        blocks anchored at ``anchors`` [B,N], each position after the true token before it."""
        hidden = self.block_hidden(features, input_ids, anchors)
        return self.position_logits(hidden, block_tokens(input_ids, anchors, self.spec.block_size))


class DSparkSession(DFlashSession):
    """Block drafting for one sequence, as llama.cpp's ``draft-dspark`` runs it: one block pass,
    then the Markov chain across its positions, each after the token drafted before it."""

    @torch.no_grad()
    def chain(self, k: int) -> tuple[list[int], list[Tensor], list[float]]:
        """Up to min(k, block_size) greedy drafts, each position's logits and confidence (1.0
        without the head)."""
        d = self.drafter
        hidden = self.block_hidden()
        prev = torch.tensor(self.last_token, device=hidden.device)
        tokens, logits, confidences = [], [], []
        for i in range(d.spec.draft_length(k)):
            row, confidence = d.position_logits(hidden[i], prev)
            prev = d.to_target_ids(row.argmax())
            tokens.append(int(prev))
            logits.append(row)
            confidences.append(1.0 if confidence is None else float(torch.sigmoid(confidence)))
        return tokens, logits, confidences

    def propose(self, k: int, temperature: float = 0.0) -> tuple[list[int], None]:
        """Greedy drafts at any temperature (llama.cpp chains on the argmax), not cut by confidence:
        eyas measures every position, as ``--spec-draft-p-min 0`` serves them."""
        return self.chain(k)[0], None


@dataclass
class DSparkObjective:
    """What :func:`eyas.train.loop.train_step` and evaluation ask of a DSpark drafter."""

    anchors: int
    block_size: int
    draft_ids: Tensor
    """[V_draft] target ids of the draft vocabulary."""
    t2d: Tensor
    """[V] whether a target id is in it."""
    confidence_weight: float
    criterion: Criterion = Criterion()

    @property
    def positions(self) -> int:
        return self.block_size

    def stats(self, forward, drafter, batch, seeds: list[int]):
        """Per block position sums over the batch; ``seeds``: one per sample, for its anchors."""
        anchors = sample_anchors(batch.loss_mask, self.anchors, seeds)
        logits, confidence = forward(batch.aux, batch.input_ids, anchors)
        answer, target_logits = block_labels(batch, anchors, self.block_size, drafter.target_head.weight)
        greedy = target_logits.argmax(-1)
        # The restricted target would teach the wrong token where its argmax lies outside the draft vocabulary.
        trained = answer & self.t2d[greedy]
        target_logp = torch.log_softmax(target_logits[..., self.draft_ids], dim=-1)
        loss, greedy_confidence = self.criterion.score(target_logp, logits)
        if confidence is not None:
            # The head learns the chance its draft is accepted: 1 − TV between the two distributions.
            with torch.no_grad():
                accepted = 1 - tv(target_logp, torch.log_softmax(logits.float(), dim=-1), 0.0).clamp(0, 1)
            bce = F.binary_cross_entropy_with_logits(confidence.float(), accepted, reduction="none")
            loss = loss + self.confidence_weight * bce
        loss = self.criterion.weigh(loss, greedy_confidence, trained)
        hits = (self.draft_ids[logits.argmax(-1)] == greedy) & answer
        return block_stats(loss, trained, hits, answer)


def dspark_config(spec: DSparkSpec, dtype: torch.dtype) -> dict[str, Any]:
    """``config.json`` of DeepSpec's ``Qwen3DSparkModel`` layout: DFlash's keys (its complete
    ``dflash_config``, which llama.cpp's converter then takes as it is) plus DSpark's own.
    Never ``aux_hidden_state_layer_ids`` or ``transformer_layer_config``: they switch llama.cpp's
    converter to the speculators layout, with another layer numbering."""
    return {
        **dflash_config(spec, dtype),
        "architectures": [DSPARK_ARCH],
        "sample_from_anchor": True,
        "draft_vocab_size": spec.draft_vocab_size,
        "markov_rank": spec.markov_rank,
        "markov_head_type": "vanilla",
        "enable_confidence_head": spec.confidence_head,
        "confidence_head_with_markov": True,
    }


class DSpark(DFlash):
    """DSpark: DFlash's block plus the Markov and confidence heads, over a reduced vocabulary."""

    name = "dspark"
    title = "DSpark"
    architectures = (DSPARK_ARCH,)
    reads = frozenset({"dspark", "draft_vocab_size"})
    formats = ("sglang", "vllm", "gguf")
    vllm_method = "dspark"
    vllm_gpu_only = True
    """vLLM 0.32 has ``dspark`` in its model runner V2 only, which needs Triton; its CPU build has none."""
    llamacpp_arch = "dflash"
    """llama.cpp converts a DSpark drafter to its DFlash architecture, with the heads' tensors."""
    llamacpp_spec_type = "draft-dspark"
    drafter_type = DSparkDrafter

    def llamacpp_p_mins(self, spec: DSparkSpec, wanted: list[float]) -> list[float]:
        """The threshold is compared with the confidence head's predicted acceptance, so without a
        head only 0: ``llama-server`` refuses a threshold it has nothing to compare with (the
        ``--spec-draft-conf-min`` of DeepSpec's papers is this flag in b11434)."""
        return wanted if spec.confidence_head else [0.0]

    def spec(self, base: DrafterSpec, config: RunConfig) -> DSparkSpec:
        cfg: DSparkConfig = config.train.dspark
        block = dflash_spec(base, cfg, self.mask_token(cfg, config), "train.dspark")
        vocab = draft_vocab_size(config.train.draft_vocab_size, base.vocab_size)
        return DSparkSpec(
            **(vars(block) | {"draft_vocab_size": vocab}),
            markov_rank=cfg.markov_rank,
            confidence_head=cfg.confidence_head,
        )

    def training(self, inputs: TrainingInputs) -> Training:
        cfg = inputs.config.train.dspark
        criterion = Criterion.of(inputs.config.train)
        spec = self.spec(inputs.base, inputs.config)
        device = inputs.lm_head.device
        vocab = inputs.vocab() if spec.reduced else None
        if vocab is None:
            draft_ids, t2d = torch.arange(spec.vocab_size), torch.ones(spec.vocab_size, dtype=torch.bool)
        else:
            draft_ids, t2d = torch.arange(spec.draft_vocab_size) + vocab[0], vocab[1]
        return Training(
            spec=spec,
            objective=DSparkObjective(
                cfg.anchors, cfg.block_size, draft_ids.to(device), t2d.to(device), cfg.confidence_weight, criterion
            ),
            step_weights=criterion.fixed_weights(decay_weights(cfg.block_size, cfg.decay)),
            vocab=vocab,
        )

    def session(self, drafter: DSparkDrafter) -> DSparkSession:
        return DSparkSession(drafter)

    def config(self, spec: DSparkSpec, dtype: torch.dtype) -> dict[str, Any]:
        return dspark_config(spec, dtype)

    def read_spec(self, config: dict[str, Any], path: Path, target_layers: int | None) -> DSparkSpec:
        block = super().read_spec(config, path, target_layers)
        return DSparkSpec(
            **vars(block),
            markov_rank=config["markov_rank"],
            confidence_head=bool(config.get("enable_confidence_head", False)),
        )

    def readme(self, spec: DrafterSpec, format: str, directory: Path, target: str, steps: int, dtype: str) -> str:
        """DeepSpec's ``Qwen3DSparkModel`` layout; vLLM runs ``dspark`` in its GPU model runner only."""
        return "\n".join(
            [
                f"# DSpark drafter for `{target}`\n\nTrained by eyas; weights in {dtype}; DeepSpec's "
                "`Qwen3DSparkModel` layout. The token embedding is not included: servers share the target's.\n",
                "## vLLM (GPU)\n\nvLLM runs `dspark` in its GPU model runner only: its CPU build refuses it.\n\n"
                + self.vllm_command(directory, target, steps, dtype),
                "## llama.cpp\n\n`eyas export CONFIG --format gguf` writes the GGUF file and its `llama-server` command.\n",
            ]
        )


DSPARK = DSpark()
