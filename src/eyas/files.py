"""Files that are either complete or absent, even after a crash or a power cut.

Every stage writes its outputs through :func:`atomic_path`: the content goes to a temporary
name beside the target, is fsynced, renamed over the target, and the directory is fsynced so
the rename itself survives. A rename without the fsyncs can leave, after a power cut, a
complete-looking name whose content never reached the disk.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path


def fsync_file(path: Path) -> None:
    with path.open("rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path beside ``path`` to write; on success it replaces ``path``, durably.

    The temporary name carries the process id, so ranks writing side by side never share one;
    on failure it is removed and ``path`` is left as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: Path, data, **dumps) -> None:
    write_text_atomic(path, json.dumps(data, **({"indent": 2} | dumps)) + "\n")
