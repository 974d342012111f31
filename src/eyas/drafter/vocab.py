"""The draft vocabulary: the most frequent target tokens the drafter has to predict.

Counted over answer tokens only (``loss_mask == 1``) of the training split: those are the
tokens the drafter is scored on. The chosen ids are sorted, so ``d2t[i] = used[i] - i`` is
non-negative and ``draft id + d2t[draft id]`` is the target id (the SGLang/vLLM convention);
``t2d`` marks the chosen ids over the target vocabulary. When the corpus has fewer distinct
tokens than the size asked for, the smallest unused ids fill the rest, so the lm_head shape
is always the configured one. Ties in frequency go to the smaller id, so the choice is
deterministic across ranks and reruns.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from eyas.files import atomic_path
from eyas.tensorfile import save_tensors

DEFAULT_DRAFT_VOCAB = 32_000


def draft_vocab_size(configured: int | None, vocab_size: int) -> int:
    """``train.draft_vocab_size`` or min(32,000, target vocab); never larger than the target's."""
    from eyas.config import ConfigError

    size = configured or min(DEFAULT_DRAFT_VOCAB, vocab_size)
    if size > vocab_size:
        raise ConfigError(f"train.draft_vocab_size: {size} is larger than the target vocabulary ({vocab_size})")
    return size


def count_answer_tokens(rows: Iterable[dict], vocab_size: int) -> np.ndarray:
    """Occurrences of each target id at ``loss_mask == 1`` positions."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for row in rows:
        ids = np.asarray(row["input_ids"], dtype=np.int64)
        mask = np.asarray(row["loss_mask"], dtype=bool)
        counts += np.bincount(ids[mask], minlength=vocab_size)[:vocab_size]
    return counts


def build_vocab(counts: np.ndarray, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t [size] int64, t2d [vocab] bool)`` for the ``size`` most frequent ids, padded."""
    vocab_size = counts.shape[0]
    # lexsort sorts by the last key first: by count descending, then by id ascending.
    order = np.lexsort((np.arange(vocab_size), -counts))
    seen = order[: min(size, int((counts > 0).sum()))]
    chosen = np.zeros(vocab_size, dtype=bool)
    chosen[seen] = True
    if len(seen) < size:
        chosen[np.flatnonzero(~chosen)[: size - len(seen)]] = True
    used = torch.from_numpy(np.flatnonzero(chosen))
    return used - torch.arange(size), torch.from_numpy(chosen)


def save_vocab(path: Path, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    with atomic_path(path) as tmp:
        save_tensors({"d2t": d2t.contiguous(), "t2d": t2d.contiguous()}, tmp)


def load_vocab(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    tensors = load_file(str(path))
    return tensors["d2t"], tensors["t2d"]
