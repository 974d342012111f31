"""Read the merged corpus: ``<run_dir>/merge/{train,eval}-NNNNN.parquet``.

Training reads the train split, evaluation the held-out eval split, extraction the train
split by row range. Rows are plain dicts with the tokenize columns
(:data:`eyas.records.TOKENIZED_COLUMNS`), in the merge's shuffled order. Files are written
with small row groups so a row range is read without decoding whole files.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq

from eyas.paths import RunPaths
from eyas.stage import StageError

SPLITS = ("train", "eval")


def split_files(paths: RunPaths, split: str) -> list[Path]:
    """The split's Parquet files in order; empty when the split has no samples."""
    _check_split(split)
    return sorted(paths.merge_dir.glob(f"{split}-[0-9][0-9][0-9][0-9][0-9].parquet"))


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}")


def _require_merged(paths: RunPaths) -> None:
    if not paths.merge_stats.is_file():
        raise StageError(f"{paths.merge_dir}: no merged corpus yet; run `eyas merge CONFIG` first")


def iter_split(paths: RunPaths, split: str, columns: list[str] | None = None) -> Iterator[dict]:
    """Yield every row of ``split`` as a dict, in the merged (shuffled) order."""
    _require_merged(paths)
    for path in split_files(paths, split):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024, columns=columns):
            yield from batch.to_pylist()


def split_lengths(paths: RunPaths, split: str) -> list[int]:
    """``num_tokens`` of every row of ``split``, in order (reads one small column)."""
    _require_merged(paths)
    lengths: list[int] = []
    for path in split_files(paths, split):
        lengths.extend(pq.read_table(path, columns=["num_tokens"]).column(0).to_pylist())
    return lengths


def read_rows(paths: RunPaths, split: str, start: int, stop: int, columns: list[str] | None = None) -> list[dict]:
    """Rows ``start:stop`` of ``split`` (global row numbers), reading only the row groups that hold them."""
    _require_merged(paths)
    rows: list[dict] = []
    offset = 0
    for path in split_files(paths, split):
        if offset >= stop:
            break
        file = pq.ParquetFile(path)
        for g in range(file.metadata.num_row_groups):
            n = file.metadata.row_group(g).num_rows
            lo, hi = max(start - offset, 0), min(stop - offset, n)
            if lo < hi:
                rows.extend(file.read_row_group(g, columns=columns).slice(lo, hi - lo).to_pylist())
            offset += n
    if len(rows) != max(stop - start, 0):
        raise ValueError(f"{paths.merge_dir}: {split} has no rows {start}:{stop} (has {offset})")
    return rows


def held_out_prompts(paths: RunPaths, limit: int | None) -> list[tuple[str, str, list[int]]]:
    """(id, dataset, prompt ids) of at most ``limit`` eval-split rows that have a prompt and an
    answer, taken from each source dataset in turn (in the split's order within each), so every
    dataset is measured even when one dominates the split. A row's prompt is its tokens before
    the first trainable one (loss mask 1), the ids the drafter sees in training, template included.
    A dataset's prompt is taken once: several answers to it (``generate.samples_per_prompt``) are
    one prompt to decode."""
    per_dataset: dict[str, list[tuple[str, str, list[int]]]] = {}
    seen: set[tuple[str, tuple[int, ...]]] = set()
    for row in iter_split(paths, "eval", columns=["id", "dataset", "input_ids", "loss_mask"]):
        mask, rows = row["loss_mask"], per_dataset.setdefault(row["dataset"], [])
        if 1 not in mask or mask.index(1) == 0 or (limit is not None and len(rows) >= limit):
            continue
        prompt = tuple(row["input_ids"][: mask.index(1)])
        if (row["dataset"], prompt) not in seen:
            seen.add((row["dataset"], prompt))
            rows.append((row["id"], row["dataset"], list(prompt)))
    chosen = [row for turn in itertools.zip_longest(*per_dataset.values()) for row in turn if row is not None]
    return chosen if limit is None else chosen[:limit]
