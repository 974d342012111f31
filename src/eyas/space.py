"""Disk space: what a stage will write, held against what its disk has free before it starts, and
a disk that fills while it writes, said as such.

The reference job writes terabytes of hidden states over days; a disk found full at hour 60 costs
the hours before it. So every stage that writes much — generate (records), extract (shards),
train (checkpoints), export (layouts), and ``eyas run`` for all of them before the first —
compares its figure with the free space first (:func:`require_room`) and stops with the figure,
the free space and the settings that would make it fit.

A disk can still fill from outside (another job, a log). Every stage commits its units whole —
records appended a line at a time (a torn last line is dropped on the next start), shards,
checkpoints and layouts written aside and renamed — so a write that fails with ENOSPC leaves
what was committed as it was; the command exits with :data:`EXIT_CODE` and a message naming
the file (:func:`disk_full_message`), and the same command resumes once there is room.
"""

from __future__ import annotations

import errno
import shutil
from dataclasses import dataclass
from pathlib import Path

from eyas.stage import StageError

EXIT_CODE = 7
"""What ``eyas`` exits with when a disk is (or would be) full."""


class DiskFull(StageError):
    """A stage would not fit on its disk, or found it full while writing."""

    EXIT_CODE = EXIT_CODE


@dataclass(frozen=True)
class Need:
    """What one stage will write: ``what`` in words, about ``bytes``."""

    what: str
    bytes: int


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def tree_bytes(path: Path) -> int:
    """Bytes a file, or every file under a directory, holds (0 for nothing there)."""
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.is_file() else 0


def free_bytes(path: Path) -> int:
    """Free bytes on the disk that holds ``path`` (or would: its nearest existing parent)."""
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def require_room(where: Path, needs: list[Need], levers: list[str]) -> None:
    """Refuse to start when ``needs`` exceed the free space of ``where``'s disk, naming each
    figure, the free space and ``levers`` (settings that write less, each with what it saves)."""
    total = sum(n.bytes for n in needs)
    free = free_bytes(where)
    if total <= free:
        return
    parts = "; ".join(f"{n.what}: {human_bytes(n.bytes)}" for n in needs if n.bytes)
    fits = f" To make it fit: {'; '.join(levers)}." if levers else ""
    raise DiskFull(
        f"{where}: {human_bytes(free)} free on its disk, and this would write about {human_bytes(total)} ({parts}); "
        f"it stops before starting rather than fill the disk part-way.{fits} Or free space, or set run_dir on a "
        "larger disk."
    )


def is_disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full_message(error: OSError) -> str:
    """What ``eyas`` says when a write found the disk full: where, that nothing committed was
    lost, and how to go on."""
    where = f" writing {error.filename}" if error.filename else ""
    return (
        f"the disk is full{where} ({error.strerror}). The stage stopped at its last committed record, shard or "
        "checkpoint; nothing committed was lost or changed. Free space (`eyas status CONFIG` shows what each stage "
        "holds) and run the same command again: it resumes from there."
    )
