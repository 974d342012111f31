"""One seam for the engines that run the target: transformers in-process, or vLLM.

Stages name the engine their config chose, pass the target's section and their own
settings (:mod:`eyas.target.settings`), and get the same interface from either:
:func:`open_generator` samples answers (``generate``) and :func:`open_prefill` captures the
aux and final states of whole samples (``extract``).
Speculative decoding in vLLM is :func:`eyas.target.vllm_engine.speculative_decode`; eyas's
own runs on the transformers model (:mod:`eyas.speculate.decode`). Only this module maps engine
names to classes, so another engine is added here and the stages do not change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch

from eyas.config import TargetConfig
from eyas.target.capture import forward, use_packing
from eyas.target.generation import BatchGenerator, LocalGenerator
from eyas.target.settings import PrefillCapture, Sampling


class Prefill(Protocol):
    def capture(self, samples: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each sample's (aux [T, 3H], final [T, H]): the aux layers' outputs, and the final state after the norm."""


class TransformersPrefill:
    """The target loaded with transformers on one device, hooked at the aux layers."""

    def __init__(self, model, aux_layers: list[int], packing: str):
        self.model, self.aux_layers = model, aux_layers
        self.packed = use_packing(model, packing)

    def capture(self, samples: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return forward(self.model, samples, self.aux_layers, self.packed)


@contextlib.contextmanager
def open_prefill(
    target: TargetConfig,
    capture: PrefillCapture,
    engine: str,
    aux_layers: list[int],
    num_layers: int,
    max_len: int,
    work_dir: Path,
    device: torch.device,
) -> Iterator[Prefill]:
    """The target ready to capture samples of up to ``max_len`` tokens; vLLM's files go under ``work_dir``."""
    if engine == "vllm":
        from eyas.target.vllm_engine import VllmPrefill

        with VllmPrefill(
            target, capture, aux_layers, num_layers, max_len, work_dir / "vllm-staging", work_dir / "vllm.log"
        ) as prefill:
            yield prefill
    else:
        from eyas.target import load_model

        yield TransformersPrefill(load_model(target, device), aux_layers, capture.packing)


@contextlib.contextmanager
def open_generator(
    target: TargetConfig, sampling: Sampling, engine: str, tokenizer, log_path: Path
) -> Iterator[BatchGenerator]:
    """The target ready to sample answers with ``sampling``."""
    from eyas.target import end_of_turn_id, load_model

    end = end_of_turn_id(tokenizer)
    if engine == "vllm":
        from eyas.target.vllm_engine import VllmGenerator

        with VllmGenerator(target, sampling, tokenizer, end, {end}, log_path) as generator:
            yield generator
    else:
        yield LocalGenerator(load_model(target), tokenizer, end, sampling)
