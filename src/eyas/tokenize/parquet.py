"""Write rebuilt samples as Parquet with exactly ``records.TOKENIZED_COLUMNS``.

Chunks are appended to ``<dataset>.parquet.tmp``, renamed when the dataset is complete: the
final file exists only whole. Lists are built from flat arrays and offsets, not per row.
"""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from eyas.files import errors_naming, fsync_dir, fsync_file
from eyas.records import tokenized_arrow_schema
from eyas.tokenize.rebuild import Sample

SCHEMA = tokenized_arrow_schema()


def table_of(samples: list[Sample], fmt: str) -> pa.Table:
    lengths = np.array([len(s.prompt_ids) + len(s.completion_ids) for s in samples], dtype=np.int32)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32))
    flat = np.fromiter(
        itertools.chain.from_iterable(itertools.chain(s.prompt_ids, s.completion_ids) for s in samples),
        dtype=np.int32,
        count=int(lengths.sum()),
    )
    mask = (
        np.concatenate(
            [np.repeat(np.array([0, 1], dtype=np.uint8), [len(s.prompt_ids), len(s.completion_ids)]) for s in samples]
        )
        if samples
        else np.zeros(0, dtype=np.uint8)
    )
    columns = [
        pa.array([s.record.id for s in samples], pa.string()),
        pa.array([s.record.dataset for s in samples], pa.string()),
        pa.ListArray.from_arrays(offsets, pa.array(flat)),
        pa.ListArray.from_arrays(offsets, pa.array(mask)),
        pa.array(lengths),
        pa.array([len(s.completion_ids) for s in samples], pa.int32()),
        pa.array([s.billed for s in samples], pa.int32()),
        pa.array([s.record.finish_reason for s in samples], pa.string()),
        pa.array([fmt] * len(samples), pa.string()),
        pa.array([s.flags for s in samples], pa.list_(pa.string())),
    ]
    return pa.Table.from_arrays(columns, schema=SCHEMA)


class ParquetOut:
    """Appends tables to a temporary file; :meth:`commit` renames it into place."""

    def __init__(self, path: Path):
        self.path = path
        self.tmp = path.with_name(path.name + ".tmp")
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with errors_naming(self.tmp):
                self._writer = pq.ParquetWriter(self.tmp, SCHEMA)
        except OSError:
            self.tmp.unlink(missing_ok=True)
            raise

    def write(self, table: pa.Table) -> None:
        with errors_naming(self.tmp):
            self._writer.write_table(table)

    def commit(self) -> None:
        with errors_naming(self.tmp):
            self._writer.close()
            fsync_file(self.tmp)
        self.tmp.replace(self.path)
        fsync_dir(self.path.parent)

    def abort(self) -> None:
        """Drop the temporary file; closing it may fail as its writes did (a full disk), and
        must not hide the error that stopped the stage."""
        with contextlib.suppress(OSError):
            self._writer.close()
        self.tmp.unlink(missing_ok=True)
