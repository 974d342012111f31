"""Durable JSON-lines files: append-only, crash-safe, resumable.

A record counts as done only once its whole line, newline included, is on disk. A process
killed mid-write can leave a partial last line; :func:`recover` finds it on the next start,
truncates it away and says so, so a killed run never leaves a torn record behind.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eyas.files import naming

log = logging.getLogger(__name__)


class JsonlError(Exception):
    """A line that is not a JSON object; the message names file and line."""


def recover(path: Path) -> int:
    """Drop a torn or unparsable final line left by a crash; return the bytes removed."""
    if not path.exists():
        return 0
    with path.open("rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        # Look back far enough to find the start of the last line, however long it is.
        tail_start = size
        chunk = 1 << 16
        while tail_start > 0:
            tail_start = max(0, tail_start - chunk)
            f.seek(tail_start)
            tail = f.read(size - tail_start)
            cut = tail.rstrip(b"\n").rfind(b"\n")
            if cut >= 0 or tail_start == 0:
                break
        last_start = tail_start + cut + 1 if cut >= 0 else 0
        f.seek(last_start)
        last = f.read()
        if last.endswith(b"\n") and _parses(last):
            return 0
        f.truncate(last_start)
        f.flush()
        os.fsync(f.fileno())
    removed = size - last_start
    log.warning("%s: dropped a torn last line (%d bytes) left by an interrupted run", path, removed)
    return removed


def _parses(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for every line; a bad line raises with file:line."""
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as e:
                raise JsonlError(f"{path}:{lineno}: not valid JSON ({e})") from None
            if not isinstance(obj, dict):
                raise JsonlError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


class DurableAppender:
    """Appends whole lines to a file, each in one write, fsyncing at most every ``sync_every_s``.

    A write that fails (a full disk) takes back what it wrote of its line and raises the
    ``OSError`` with the file's name, so the file ends with the last whole line either way."""

    def __init__(self, path: Path, sync_every_s: float = 1.0):
        path.parent.mkdir(parents=True, exist_ok=True)
        recover(path)
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        self._sync_every_s = sync_every_s
        self._last_sync = time.monotonic()

    def write(self, line: str) -> None:
        whole = (line + "\n").encode("utf-8")
        data = memoryview(whole)
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError as e:
            os.ftruncate(self._fd, self._size)
            raise naming(e, self.path) from None
        self._size += len(whole)
        if time.monotonic() - self._last_sync >= self._sync_every_s:
            self.sync()

    def write_json(self, obj: object) -> None:
        self.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))

    def sync(self) -> None:
        try:
            os.fsync(self._fd)
        except OSError as e:
            raise naming(e, self.path) from None
        self._last_sync = time.monotonic()

    def close(self) -> None:
        if self._fd is not None:
            try:
                self.sync()
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> DurableAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
