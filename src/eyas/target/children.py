"""Engines eyas runs as child processes (vLLM, ``llama-server``): started so they die with eyas.

An engine outlives a killed parent and keeps its memory (and GPUs) unless told otherwise, and
vLLM's engine and workers are processes of their own. So every child leads a process group of
its own (:func:`stop_group` kills it whole) and is started through ``die_with_eyas.py``, which
asks Linux to send it SIGTERM when eyas dies — even by SIGKILL — and then becomes the engine
(``exec``): asked by the child itself, since a ``preexec_fn`` would run between fork and exec,
which is unsafe in a threaded parent.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

PARENT_ENV = "EYAS_PARENT_PID"
"""eyas's pid, handed to the launcher so it can tell whether eyas died before it asked to die with it."""
LAUNCHER = Path(__file__).resolve().with_name("die_with_eyas.py")


def start_child(argv: list[str], log_file, env: dict | None = None, **popen_args) -> subprocess.Popen:
    """Start ``argv`` logging to ``log_file``, leading a process group of its own, dying with eyas."""
    env = {**(env or os.environ), PARENT_ENV: str(os.getpid())}
    return subprocess.Popen(
        [sys.executable, str(LAUNCHER), *argv],
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        **popen_args,
    )


def stop_group(process: subprocess.Popen) -> None:
    """Kill a child and every process it started."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of a child's log, for an error message."""
    return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:]) if path.is_file() else ""
