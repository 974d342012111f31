"""SIGKILL a command at chosen points of its work, to check what it leaves behind each time."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


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


def processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group) of every process, from /proc; a process that ends while
    it is read is left out."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            table[int(stat.parent.name)] = (int(fields[1]), int(fields[2]))
        except (OSError, IndexError, ValueError):
            continue
    return table


def descendants(pid: int) -> list[int]:
    """Every process descended from ``pid``."""
    table = processes()
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, (pp, _) in table.items() if pp == parent]
        found += kids
        frontier += kids
    return found


def command_line(pid: int) -> bytes:
    """The process's command line, or b"" once it has ended (it may end between listing and reading)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def kill_engine_child(command: list[str], ready: Callable[[], bool], name: bytes = b"llama-server", **popen):
    """Start ``command`` and SIGKILL its first ``name`` child (an engine server) once ``ready()``
    holds; returns the child killed (None if the command ended first), the command's exit code and
    what it printed, its whitespace collapsed."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)
    killed = None
    while killed is None and proc.poll() is None:
        servers = [p for p in descendants(proc.pid) if name in command_line(p)]
        if servers and ready():
            killed = servers[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.01)
    said = " ".join(proc.communicate(timeout=600)[0].split())
    return killed, proc.returncode, said


def child_groups(pid: int) -> set[int]:
    """The process groups that children of ``pid`` lead: its engine children (vLLM, llama.cpp)."""
    return {group for child, (parent, group) in processes().items() if parent == pid and group == child}
