"""SIGKILL a command at chosen points of its work, to check what it leaves behind each time."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable


def kill_at_each(command: list[str], points: list[Callable[[], bool]], outputs: Callable[[], object], old, **popen):
    """Start ``command`` once per point and SIGKILL it as soon as the point is reached (or it has
    ended); after each kill, note whether ``outputs()`` are still ``old`` ("old") or not ("new").
    Stops at the first "new": the command then finished its work before a kill could land."""
    seen = []
    for reached in points:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **popen)
        while not reached() and proc.poll() is None:
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        seen.append("old" if outputs() == old else "new")
        if seen[-1] == "new":
            break
    return seen
