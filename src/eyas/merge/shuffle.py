"""Bounded-memory external shuffle: spill rows to key-range buckets, then sort one bucket at a time.

Each row carries a 64-bit order key (:func:`eyas.merge.plan.order_key`). Rows are appended to
the bucket file that owns their key range, buffering at most ``flush_bytes`` per bucket; then
each bucket — sized to fit in memory — is read back, sorted by key and streamed to the output.
Peak memory is about one bucket plus the buffers, whatever the corpus size.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from eyas.merge.plan import bucket_of

KEY = "_order_key"
ROW_GROUP_ROWS = 1024
"""Small row groups let readers fetch a row range (extraction shards) without whole files."""


class Buckets:
    """The spill files of one split under ``directory``."""

    def __init__(self, directory: Path, split: str, count: int, schema: pa.Schema, flush_bytes: int):
        self.directory, self.split, self.count = directory, split, count
        self.schema = schema.append(pa.field(KEY, pa.uint64()))
        self.flush_bytes = flush_bytes
        self._writers: dict[int, pq.ParquetWriter] = {}
        self._pending: dict[int, list[pa.Table]] = {}
        self._pending_bytes: dict[int, int] = {}
        directory.mkdir(parents=True, exist_ok=True)

    def _path(self, bucket: int) -> Path:
        return self.directory / f"{self.split}-{bucket:05d}.parquet"

    def add(self, table: pa.Table, keys: np.ndarray) -> None:
        table = table.append_column(KEY, pa.array(keys, pa.uint64()))
        buckets = np.fromiter((bucket_of(int(k), self.count) for k in keys), np.int64, len(keys))
        for b in np.unique(buckets):
            part = table.filter(pa.array(buckets == b))
            self._pending.setdefault(int(b), []).append(part)
            self._pending_bytes[int(b)] = self._pending_bytes.get(int(b), 0) + part.nbytes
            if self._pending_bytes[int(b)] >= self.flush_bytes:
                self._flush(int(b))

    def _flush(self, bucket: int) -> None:
        parts = self._pending.pop(bucket, [])
        self._pending_bytes.pop(bucket, None)
        if not parts:
            return
        if bucket not in self._writers:
            self._writers[bucket] = pq.ParquetWriter(self._path(bucket), self.schema)
        self._writers[bucket].write_table(pa.concat_tables(parts))

    def close(self) -> None:
        for bucket in list(self._pending):
            self._flush(bucket)
        for writer in self._writers.values():
            writer.close()

    def sorted_tables(self) -> Iterator[pa.Table]:
        """Each bucket in key order, sorted, without the key column; a bucket file is deleted once read."""
        for bucket in range(self.count):
            path = self._path(bucket)
            if not path.exists():
                continue
            table = pq.read_table(path)
            path.unlink()
            order = pc.sort_indices(table, sort_keys=[(KEY, "ascending")])
            yield table.take(order).drop_columns([KEY])


class SplitWriter:
    """Streams rows into ``<split>-NNNNN.parquet`` files of ``shard_samples`` rows each."""

    def __init__(self, directory: Path, split: str, shard_samples: int, schema: pa.Schema):
        self.directory, self.split, self.shard_samples, self.schema = directory, split, shard_samples, schema
        self.files: list[Path] = []
        self._writer: pq.ParquetWriter | None = None
        self._rows_in_file = 0

    def write(self, table: pa.Table) -> None:
        while table.num_rows:
            if self._writer is None or self._rows_in_file == self.shard_samples:
                self._open_next()
            take = min(table.num_rows, self.shard_samples - self._rows_in_file)
            self._writer.write_table(table.slice(0, take), row_group_size=ROW_GROUP_ROWS)
            self._rows_in_file += take
            table = table.slice(take)

    def _open_next(self) -> None:
        if self._writer is not None:
            self._writer.close()
        path = self.directory / f"{self.split}-{len(self.files):05d}.parquet"
        self.files.append(path)
        self._writer = pq.ParquetWriter(path, self.schema)
        self._rows_in_file = 0

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
