"""A small real disk for fault tests: a tmpfs mounted over a folder (tests run as root here and
in CI), grown in place by a remount, filled by a ballast file; unmounted when the test ends."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(where: Path, size: str):
    """``where`` as a tmpfs of ``size`` (``mount`` syntax: 4M); the test is skipped, with the
    reason printed, where mounting is refused."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here to fill a disk for real: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def grow(where: Path, size: str) -> None:
    """Remount the tmpfs at ``where`` bigger, keeping what it holds."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(where)], check=True)


def fill(where: Path) -> Path:
    """Write a ballast file in ``where`` until its disk has no byte left; returns it."""
    ballast = where / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT)
    try:
        for chunk in (1 << 20, 1 << 12, 1):
            while True:
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return ballast


def fill_once(proc: subprocess.Popen, ready, where: Path, timeout_s: float = 300) -> Path:
    """Wait until ``ready()`` (a stage has committed its first unit), then fill ``where``'s disk
    while ``proc`` is stopped, so its next write is the one that finds the disk full; returns
    the ballast file."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None, "the stage ended before it committed a unit"
        assert time.monotonic() < deadline, f"the stage committed no unit in {timeout_s:g} s"
        time.sleep(0.001)
    proc.send_signal(signal.SIGSTOP)
    try:
        return fill(where)
    finally:
        proc.send_signal(signal.SIGCONT)
