"""Pure planning for extraction: shards, ranks, batches, and the bytes a token costs.

Shards are contiguous runs of the merged train split (in its shuffled order), so sample
``i`` of the hidden states is row ``i`` of the train split and a shard can be redone alone.
"""

from __future__ import annotations

SHARD_TARGET_BYTES = 1 << 30
"""Default shard size: large enough that a 100M-token corpus is a few thousand files, small
enough that a shard is assembled in memory and a lost one is cheap to redo."""

BYTES_PER_VALUE = {"bf16": 2, "fp8": 1}
"""Bytes of one aux value; ``final`` is always bfloat16 (2 bytes), the teacher's exact input."""
FINAL_BYTES_PER_VALUE = 2
SCALE_BYTES = 4
"""fp8 keeps one float32 scale per token per aux layer."""


def bytes_per_token(hidden_size: int, num_aux: int, dtype: str) -> int:
    """Disk bytes of one token: aux states, the bf16 final state, fp8 aux scales, its id (int32) and mask (uint8).

    bf16: ``(num_aux + 1)·H·2 + 5``; fp8: ``num_aux·H·1 + num_aux·4 + H·2 + 5``.
    """
    scales = num_aux * SCALE_BYTES if dtype == "fp8" else 0
    aux = num_aux * hidden_size * BYTES_PER_VALUE[dtype]
    return aux + hidden_size * FINAL_BYTES_PER_VALUE + scales + 4 + 1


def default_shard_tokens(hidden_size: int, num_aux: int, dtype: str) -> int:
    return max(1, SHARD_TARGET_BYTES // bytes_per_token(hidden_size, num_aux, dtype))


def plan_shards(lengths: list[int], shard_tokens: int) -> list[range]:
    """Cut the samples, in order, into runs of at most ``shard_tokens`` tokens (at least one sample each)."""
    shards, start, tokens = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and tokens + n > shard_tokens:
            shards.append(range(start, i))
            start, tokens = i, 0
        tokens += n
    if start < len(lengths):
        shards.append(range(start, len(lengths)))
    return shards


def rank_shards(num_shards: int, rank: int, world_size: int) -> list[int]:
    """Shards rank ``rank`` writes: every ``world_size``-th one, so no two ranks share a file."""
    return list(range(rank, num_shards, world_size))


def plan_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Group sample indices into forward batches, longest first (an out-of-memory shows up at once).

    Sorted by length, a padded batch wastes little; a batch holds samples while
    ``count × longest ≤ batch_tokens``, and a sample longer than that goes alone.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches
