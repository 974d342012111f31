"""Files that are either complete or absent, even after a crash or a power cut.

Every output a marker vouches for or a later stage reads reaches its name in one of three ways,
each fsynced before anything points at it (figures and engine logs, drawn for people to read,
are plain writes). A single file goes through :func:`atomic_path` (a Parquet file written in
parts, through the same steps): the content goes to a temporary name beside the target, is
fsynced, renamed over the target, and the directory is fsynced so the rename itself survives. A
directory (a drafter, a checkpoint, a redo) is written whole under a temporary name and put in
place by :func:`replace_dir`, which first fsyncs every file and directory in it. A log appended
in place (generation records, eval results, ``train/metrics.jsonl``) goes through
:class:`eyas.jsonl.DurableAppender`, which fsyncs at least every second and on close, and whose
torn last line the next start drops. A rename without the fsyncs can leave, after a power cut, a
complete-looking name whose content never reached the disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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


def fsync_tree(path: Path) -> None:
    """Every file under ``path``, then every directory from the deepest up, on disk."""
    for root, _, files in os.walk(path, topdown=False):
        for name in files:
            fsync_file(Path(root, name))
        fsync_dir(Path(root))


def naming(error: OSError, path: Path) -> OSError:
    """``error`` with the file it was about, where the OS left the name out (a write or a flush
    that finds the disk full names no file), so what eyas says names it."""
    if error.filename or error.errno is None:
        return error
    return OSError(error.errno, error.strerror, str(path))  # the errno picks the subclass, as the OS's own would


@contextlib.contextmanager
def errors_naming(path: Path) -> Iterator[None]:
    """Raise an OSError from inside with ``path`` named (:func:`naming`): for writers, such as
    Arrow's, whose errors carry the errno but no file."""
    try:
        yield
    except OSError as e:
        raise naming(e, path) from None


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
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise naming(e, path) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_text_atomic(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: Path, data, **dumps) -> None:
    write_text_atomic(path, json.dumps(data, **({"indent": 2} | dumps)) + "\n")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    errno = ctypes.get_errno()
    if errno in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: this kernel or file system cannot exchange
        return False
    raise OSError(errno, os.strerror(errno), str(a))


def replace_dir(new: Path, old: Path) -> None:
    """Put the complete directory ``new`` where ``old`` is, so that a crash at any moment leaves
    either all of ``old`` or all of ``new`` at ``old``'s name, never a mix and never nothing.

    A stage builds a redo beside its current outputs (their marker inside) and swaps it in here.
    The outputs swapped out are renamed ``<old>.old`` at once and deleted from there, so that a
    crash while deleting them (hidden states take a while) leaves them under a name that
    :func:`recover_dir` removes, not in the redo place where they would pass for a redo. Where
    the two cannot be exchanged in one step, ``old`` is renamed to ``<old>.old`` first, which
    :func:`recover_dir` puts back if a crash falls between the two renames. ``new`` is fsynced
    first, so the name never holds files whose content a power cut lost.
    """
    fsync_tree(new)
    recover_dir(old)
    aside = old.with_name(old.name + ".old")
    if not old.exists():
        new.rename(old)
    elif _exchange(new, old):
        new.rename(aside)
    else:
        old.rename(aside)
        new.rename(old)
    fsync_dir(old.parent)
    if aside.exists():
        shutil.rmtree(aside)


@contextlib.contextmanager
def built_aside(out: Path) -> Iterator[Path]:
    """``<out>.tmp``, empty, to build a stage's outputs in; swapped in whole for ``out`` when the
    block ends (:func:`replace_dir`). A write that fails there (a full disk) removes what was built,
    so the disk gets its room back, and the error names the place."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        yield tmp
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise naming(e, tmp) from None
    replace_dir(tmp, out)


def recover_dir(path: Path) -> None:
    """Mend a :func:`replace_dir` that was cut short: between its two renames the old outputs
    come back; after the swap, the rest of the swapped-out outputs is deleted."""
    aside = path.with_name(path.name + ".old")
    if aside.exists():
        if path.exists():
            shutil.rmtree(aside)
        else:
            aside.rename(path)
