"""Read raw rows from a dataset source: a local JSONL/JSON/Parquet file or directory, or a hub dataset.

Each row comes with a location (``file:line`` or ``file:row N``) so every problem found later
can be reported where a person can find it. Rows are streamed, never all held in memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eyas.config import ConfigError, DatasetConfig

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class RawRow:
    location: str
    """Where the row is: `path:line` for JSONL, `path:row N` otherwise."""
    data: Any
    error: str | None = None
    """Set when the row could not even be parsed (bad JSON)."""


def source_identity(dataset: DatasetConfig) -> dict:
    """Which rows a source holds: a local file or directory by content (a sha256 over its files'
    names and bytes, not its path, so a run moved elsewhere stays current while a row added
    to the file does not); a hub dataset by id, split and subset."""
    path = Path(dataset.source).expanduser()
    if _is_hub_id(dataset.source, path) and not path.exists():
        return {"source": dataset.source, "split": dataset.split, "subset": dataset.subset}
    return {"source content": _local_digest(path) if path.exists() else "missing"}


def _local_digest(path: Path) -> str:
    import hashlib

    files = _source_files(path) if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        with f.open("rb") as data:
            h.update(f"{f.relative_to(path) if path.is_dir() else f.name}\0".encode())
            h.update(hashlib.file_digest(data, "sha256").digest())
    return h.hexdigest()


def _source_files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.suffix in FILE_SUFFIXES)


def _is_hub_id(source: str, path: Path) -> bool:
    return not (source.startswith((".", "/", "~")) or path.suffix in FILE_SUFFIXES)


def iter_rows(dataset: DatasetConfig) -> Iterator[RawRow]:
    path = Path(dataset.source).expanduser()
    if path.is_dir():
        files = _source_files(path)
        if not files:
            raise ConfigError(f"datasets[{dataset.name}].source: {path} holds no .jsonl, .json or .parquet file")
        for f in files:
            yield from _iter_file(f)
    elif path.is_file():
        if path.suffix not in FILE_SUFFIXES:
            raise ConfigError(f"datasets[{dataset.name}].source: {path} is not .jsonl, .json or .parquet")
        yield from _iter_file(path)
    elif not _is_hub_id(dataset.source, path):
        raise ConfigError(f"datasets[{dataset.name}].source: {path} does not exist")
    else:
        yield from _iter_hub(dataset)


def _iter_file(path: Path) -> Iterator[RawRow]:
    if path.suffix == ".jsonl":
        yield from _iter_jsonl(path)
    elif path.suffix == ".json":
        yield from _iter_json(path)
    else:
        yield from _iter_parquet(path)


def _iter_jsonl(path: Path) -> Iterator[RawRow]:
    """Each line a row; one that is not UTF-8 text or not JSON (a file cut short ends in one) is
    a row skipped with its line and the reason, like any other bad row."""
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield RawRow(
                    f"{path}:{lineno}", None, f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
                )
                continue
            if not line.strip():
                continue
            try:
                yield RawRow(f"{path}:{lineno}", json.loads(line))
            except ValueError as e:
                yield RawRow(f"{path}:{lineno}", None, f"not valid JSON ({e.args[0] if e.args else e})")


def _iter_json(path: Path) -> Iterator[RawRow]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise ConfigError(f'{path}: expected a JSON list of rows (or {{"data": [...]}})')
    for i, row in enumerate(data):
        yield RawRow(f"{path}:row {i}", row)


def _iter_parquet(path: Path) -> Iterator[RawRow]:
    import pyarrow.parquet as pq

    index = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            yield RawRow(f"{path}:row {index}", row)
            index += 1


def _iter_hub(dataset: DatasetConfig) -> Iterator[RawRow]:
    import datasets

    try:
        data = datasets.load_dataset(dataset.source, dataset.subset, split=dataset.split, streaming=True)
    except Exception as e:  # datasets raises many unrelated types for "cannot load"
        raise ConfigError(
            f"datasets[{dataset.name}].source: cannot load hub dataset {dataset.source!r} split {dataset.split!r}: {e}"
        ) from None
    for i, row in enumerate(data):
        yield RawRow(f"{dataset.source}[{dataset.split}]:row {i}", row)
