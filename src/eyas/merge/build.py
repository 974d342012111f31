"""The merge itself: scan every tokenized dataset, plan each sample's fate, shuffle, write.

Two reads of the input. The scan reads only ids and loss masks and keeps a few numbers per
sample; the plan (pure, :mod:`eyas.merge.plan`) decides split, copies and drops from them;
the second read streams full rows through the bucketed shuffle (:mod:`eyas.merge.shuffle`).
Output goes to ``merge.tmp/`` and replaces ``merge/`` only when complete, its stage marker
inside, so readers never see half a corpus and an interrupted merge leaves the previous one
and its marker intact.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from eyas.config import ConfigError, DatasetConfig, RunConfig
from eyas.console import progress
from eyas.files import built_aside
from eyas.merge import plan
from eyas.merge.shuffle import Buckets, SplitWriter
from eyas.merge.stats import DROP_REASONS, SplitStats
from eyas.paths import MERGE_STATS, RunPaths
from eyas.records import SCHEMA_VERSION, TOKENIZED_COLUMNS, tokenized_arrow_schema
from eyas.stage import StageError, StageRun

log = logging.getLogger(__name__)

READ_BATCH_ROWS = 1024
BYTES_PER_TOKEN = 5
"""int32 id + uint8 mask: the in-memory size of a token in a bucket."""


@dataclass
class Scan:
    """What the first read learns about one dataset, a few numbers per sample."""

    dataset: DatasetConfig
    path: Path
    ids: list[str] = field(default_factory=list)
    lengths: list[np.ndarray] = field(default_factory=list)
    trainable: list[np.ndarray] = field(default_factory=list)
    too_long: list[np.ndarray] = field(default_factory=list)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        def cat(parts, dtype):
            return np.concatenate(parts) if parts else np.zeros(0, dtype)

        return cat(self.lengths, np.int64), cat(self.trainable, np.int64), cat(self.too_long, bool)


@dataclass
class Placement:
    """Where one dataset's samples go: parallel arrays over output rows, sorted by input row."""

    rows: np.ndarray
    copies: np.ndarray
    ids: list[str]
    keys: np.ndarray
    is_eval: np.ndarray

    def subset(self, keep: np.ndarray) -> Placement:
        return Placement(
            self.rows[keep],
            self.copies[keep],
            [i for i, k in zip(self.ids, keep) if k],
            self.keys[keep],
            self.is_eval[keep],
        )


def input_path(paths: RunPaths, dataset: DatasetConfig) -> Path:
    path = paths.tokenized(dataset.name)
    if not path.is_file():
        raise StageError(f"{path}: no tokenized data for dataset {dataset.name!r}; run `eyas tokenize CONFIG` first")
    names = set(pq.read_schema(path).names)
    missing = [c for c in TOKENIZED_COLUMNS if c not in names]
    if missing:
        raise ConfigError(f"{path}: not a tokenize output (missing columns: {', '.join(missing)})")
    return path


def scan(dataset: DatasetConfig, path: Path, max_seq_len: int | None, advance=lambda n: None) -> Scan:
    result = Scan(dataset, path)
    for batch in pq.ParquetFile(path).iter_batches(
        batch_size=READ_BATCH_ROWS, columns=["id", "loss_mask", "input_ids"]
    ):
        ids, masks, tokens = batch.column(0), batch.column(1), batch.column(2)
        bad = pc.not_equal(pc.list_value_length(masks), pc.list_value_length(tokens))
        if pc.any(bad).as_py():
            row = len(result.ids) + pc.index(bad, True).as_py()
            raise StageError(f"{path}: row {row}: loss_mask and input_ids differ in length")
        kept, trainable, too_long = plan.kept_lengths(masks, max_seq_len)
        result.ids.extend(ids.to_pylist())
        result.lengths.append(kept)
        result.trainable.append(trainable)
        result.too_long.append(too_long)
        advance(batch.num_rows)
    return result


def place(s: Scan, held_out: set[str], config: RunConfig, dropped: dict[str, int]) -> Placement:
    """Apply the plan to one dataset; ``dropped`` counts every sample left out and why."""
    seed, m = config.merge.seed, config.merge
    lengths, trainable, too_long = s.arrays()
    rows, ks, ids, keys, is_eval = [], [], [], [], []
    for row, sample_id in enumerate(s.ids):
        if too_long[row] and m.overflow == "drop":
            dropped["too_long"] += 1
            continue
        if trainable[row] == 0:
            dropped["no_trainable"] += 1
            continue
        evaluating = plan.base_prompt_id(sample_id) in held_out
        n = 1 if evaluating else plan.copies(s.dataset.weight, seed, sample_id)
        if n == 0:
            dropped["weight"] += 1
        for k in range(n):
            out_id = plan.copy_id(sample_id, k)
            rows.append(row), ks.append(k), ids.append(out_id), is_eval.append(evaluating)
            keys.append(plan.order_key(seed, out_id))
    placement = Placement(
        np.array(rows, np.int64), np.array(ks, np.int64), ids, np.array(keys, np.uint64), np.array(is_eval, bool)
    )
    cutoff = plan.budget_cutoff(
        placement.keys[~placement.is_eval], lengths[placement.rows[~placement.is_eval]], s.dataset.merge_token_budget
    )
    if cutoff is not None:
        within = np.array([int(k) <= cutoff for k in placement.keys], bool)
        keep = placement.is_eval | within
        dropped["token_budget"] += int((~keep).sum())
        placement = placement.subset(keep)
    return placement


def _output_rows(
    batch: pa.RecordBatch, first_row: int, p: Placement, max_seq_len: int | None
) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """The batch's rows as they will be written (copies, new ids, truncation), their keys and splits."""
    lo, hi = np.searchsorted(p.rows, [first_row, first_row + batch.num_rows])
    local = p.rows[lo:hi] - first_row
    table = pa.Table.from_batches([batch]).take(pa.array(local))
    table = table.set_column(table.schema.get_field_index("id"), "id", pa.array(p.ids[lo:hi], pa.string()))
    if max_seq_len is not None:
        lengths = pc.list_value_length(table.column("input_ids")).to_numpy()
        cut = lengths > max_seq_len
        if cut.any():
            for name in ("input_ids", "loss_mask"):
                column = pc.list_slice(table.column(name), 0, max_seq_len)
                table = table.set_column(
                    table.schema.get_field_index(name), name, column.cast(table.schema.field(name).type)
                )
            table = table.set_column(
                table.schema.get_field_index("num_tokens"),
                "num_tokens",
                pa.array(np.minimum(lengths, max_seq_len), table.schema.field("num_tokens").type),
            )
            flags = [f + ["truncated"] if c else f for f, c in zip(table.column("flags").to_pylist(), cut)]
            table = table.set_column(
                table.schema.get_field_index("flags"), "flags", pa.array(flags, pa.list_(pa.string()))
            )
    return table, p.keys[lo:hi], p.is_eval[lo:hi]


def merge(config: RunConfig, started: StageRun, quiet: bool = False) -> dict:
    """Merge every non-dropped dataset into ``merge/``; returns the stats also written to stats.json.
    ``started`` is the stage's marker, written into the new corpus before it replaces the old."""
    paths = RunPaths.of(config)
    m = config.merge
    datasets = [d for d in config.datasets if not d.drop]
    if not datasets:
        raise ConfigError("datasets: nothing to merge (no datasets, or all have drop: true)")
    inputs = [input_path(paths, d) for d in datasets]
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in inputs)
    with progress(quiet, unit="rows") as bar:
        phase = _Phase(bar)
        phase.start("merge: scan", rows)
        scans = [scan(d, path, m.max_seq_len, phase.advance) for d, path in zip(datasets, inputs)]
        with built_aside(paths.merge_dir) as tmp:
            stats = _shuffle_and_write(config, scans, phase, rows, tmp)
            started.finish(paths.moving("merge", tmp).marker("merge"))
    return stats


class _Phase:
    """One progress bar reused by the merge's three passes, with the rate of the current one."""

    def __init__(self, bar):
        self.bar, self.task = bar, None

    def start(self, name: str, total: int) -> None:
        if self.task is None:
            self.task = self.bar.add_task(name, total=total, rate=0.0)
        self.bar.update(self.task, description=name, completed=0, total=total, rate=0.0)
        self.started, self.done = time.monotonic(), 0

    def advance(self, n: int) -> None:
        self.done += n
        self.bar.update(self.task, completed=self.done, rate=self.done / max(time.monotonic() - self.started, 1e-9))


def _shuffle_and_write(config: RunConfig, scans: list[Scan], phase: _Phase, rows: int, tmp: Path) -> dict:
    """The corpus and its stats, built in ``tmp``; returns the stats."""
    m = config.merge

    prompts = {plan.base_prompt_id(i) for s in scans for i in s.ids}
    k = plan.eval_count(len(prompts), m.eval_fraction, m.eval_count)
    if k > len(prompts):
        raise ConfigError(f"merge.eval_count: {k} is more than the {len(prompts)} prompt ids in the corpus")
    held_out = plan.select_eval(prompts, m.seed, k)

    schema = tokenized_arrow_schema()
    tmp.mkdir(parents=True)
    stats: dict = {
        "schema_version": SCHEMA_VERSION,
        "seed": m.seed,
        "max_seq_len": m.max_seq_len,
        "overflow": m.overflow,
        "eval_prompts": len(held_out),
        "datasets": {},
    }
    placements = []
    totals = {"train": SplitStats(), "eval": SplitStats()}
    for s in scans:
        dropped = dict.fromkeys(DROP_REASONS, 0)
        p = place(s, held_out, config, dropped)
        placements.append(p)
        lengths, trainable, too_long = s.arrays()
        entry = {"source": str(s.path), "weight": s.dataset.weight}
        for split, mask in (("train", ~p.is_eval), ("eval", p.is_eval)):
            part, rows_in_split = SplitStats(), p.rows[mask]
            for target in (part, totals[split]):
                target.add(lengths[rows_in_split], trainable[rows_in_split], too_long[rows_in_split])
            entry[split] = part.to_json()
        stats["datasets"][s.dataset.name] = {**entry, "dropped": dropped}

    total_tokens = totals["train"].tokens + totals["eval"].tokens
    bucket_bytes = m.bucket_mb << 20
    count = plan.bucket_count(total_tokens * BYTES_PER_TOKEN, bucket_bytes)
    flush = max(1 << 20, bucket_bytes // (4 * count))
    buckets = {split: Buckets(tmp / "buckets", split, count, schema, flush) for split in ("train", "eval")}
    phase.start("merge: shuffle", rows)
    for s, p in zip(scans, placements):
        first = 0
        for batch in pq.ParquetFile(s.path).iter_batches(batch_size=READ_BATCH_ROWS, columns=list(TOKENIZED_COLUMNS)):
            table, keys, is_eval = _output_rows(batch.cast(schema), first, p, m.max_seq_len)
            first += batch.num_rows
            phase.advance(batch.num_rows)
            for split, mask in (("train", ~is_eval), ("eval", is_eval)):
                if mask.any():
                    buckets[split].add(table.filter(pa.array(mask)), keys[mask])
    phase.start("merge: write", sum(len(p.ids) for p in placements))
    for split, b in buckets.items():
        b.close()
        writer = SplitWriter(tmp, split, m.shard_samples, schema)
        for table in b.sorted_tables():
            writer.write(table)
            phase.advance(table.num_rows)
        writer.close()
    shutil.rmtree(tmp / "buckets")

    stats.update({split: total.to_json() for split, total in totals.items()})
    stats["dropped"] = {r: sum(e["dropped"][r] for e in stats["datasets"].values()) for r in DROP_REASONS}
    (tmp / MERGE_STATS).write_text(json.dumps(stats, indent=2))
    return stats
