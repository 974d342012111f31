"""Pure decisions of the merge, one function each, so they are testable without files.

Every random choice is a hash of ``(merge.seed, purpose, sample id)`` rather than a draw
from a generator: the same sample gets the same fate whatever order the files are read in
and however many shuffle buckets memory allows, so a merge is reproducible bit for bit.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pyarrow as pa

from eyas.records import row_prompt_id


def hash64(seed: int, purpose: str, key: str) -> int:
    """A stable 64-bit hash: the one source of randomness in the merge."""
    digest = hashlib.blake2b(f"{seed}\x00{purpose}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def unit(seed: int, purpose: str, key: str) -> float:
    """A stable uniform number in [0, 1)."""
    return hash64(seed, purpose, key) / 2.0**64


def base_prompt_id(sample_id: str) -> str:
    """The row a sample answers: ``<dataset>/<prompt>~<answer>#<turn>`` → ``<prompt>``.

    All turns of one conversation and all answers to one prompt share it, so holding out by it
    never splits a conversation or trains on another answer to a held-out prompt, and the same
    prompt in two datasets lands on the same side.
    """
    return row_prompt_id(sample_id.split("/", 1)[1] if "/" in sample_id else sample_id)


def eval_count(num_prompts: int, fraction: float, count: int | None) -> int:
    """How many prompt ids to hold out: ``count`` exactly, else ``fraction`` of them (≥ 1 when > 0)."""
    if count is not None:
        return count
    if fraction <= 0 or num_prompts < 2:
        return 0
    return min(num_prompts - 1, max(1, round(fraction * num_prompts)))


def select_eval(prompt_ids: set[str], seed: int, k: int) -> set[str]:
    """The ``k`` prompt ids with the smallest hash: a seeded uniform sample without replacement."""
    return set(sorted(prompt_ids, key=lambda p: (hash64(seed, "eval", p), p))[:k])


def copies(weight: float, seed: int, sample_id: str) -> int:
    """How many times a training sample appears: ⌊weight⌋, plus one more with probability frac(weight)."""
    whole = math.floor(weight)
    return whole + (1 if unit(seed, "weight", sample_id) < weight - whole else 0)


def copy_id(sample_id: str, k: int) -> str:
    """Ids stay unique when a weight repeats a sample: the k-th extra copy is ``<id>@<k>``."""
    return sample_id if k == 0 else f"{sample_id}@{k}"


def order_key(seed: int, sample_id: str) -> int:
    """Position in the shuffled output: samples are written in increasing key order."""
    return hash64(seed, "order", sample_id)


def kept_lengths(loss_mask: pa.ListArray, max_seq_len: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: tokens kept, trainable tokens kept, and whether the row is longer than the cap.

    Vectorised over the flattened masks (a cumulative sum), so a 138M-token corpus costs
    seconds, not a Python loop per token. Truncation keeps the first ``max_seq_len`` tokens.
    """
    offsets = loss_mask.offsets.to_numpy()
    lengths = np.diff(offsets)
    cap = lengths if max_seq_len is None else np.minimum(lengths, max_seq_len)
    values = loss_mask.flatten().to_numpy(zero_copy_only=False).astype(np.int64)
    cumulative = np.concatenate([[0], np.cumsum(values != 0)])
    base = offsets[:-1] - offsets[0]
    trainable = cumulative[base + cap] - cumulative[base]
    too_long = lengths > cap
    return cap, trainable, too_long


def bucket_count(total_bytes: int, bucket_bytes: int) -> int:
    """Shuffle buckets needed so each fits in ``bucket_bytes``; a power of two (see :func:`bucket_of`)."""
    needed = max(1, math.ceil(total_bytes / bucket_bytes))
    return 1 << (needed - 1).bit_length()


def bucket_of(key: int, buckets: int) -> int:
    """Buckets are contiguous key ranges, so sorting each bucket and concatenating them
    yields the global key order: the output does not depend on the bucket count."""
    return key >> (64 - (buckets.bit_length() - 1)) if buckets > 1 else 0


def budget_cutoff(keys: np.ndarray, tokens: np.ndarray, budget: int | None) -> int | None:
    """Largest order key kept under a dataset's ``merge_token_budget`` (None: no limit).

    Samples are taken in shuffled order until the next one would pass the budget, so the
    kept subset is a seeded random sample, not the head of the file.
    """
    if budget is None or len(keys) == 0:
        return None
    order = np.argsort(keys, kind="stable")
    within = np.cumsum(tokens[order]) <= budget
    if within.all():
        return None
    last = int(np.argmin(within)) - 1
    return -1 if last < 0 else int(keys[order[last]])
