"""Logging and progress: logs go to stderr and ``<run_dir>/eyas.log``; progress bars use rich."""

from __future__ import annotations

import logging
from pathlib import Path

from rich.console import Console
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

console = Console(stderr=True)
_file_handler: logging.Handler | None = None


def setup_logging(log_file: Path | None = None, quiet: bool = False) -> None:
    """Send eyas logs to stderr (warnings only when quiet) and, when given, to ``log_file``."""
    global _file_handler
    root = logging.getLogger("eyas")
    root.setLevel(logging.INFO)
    if not any(isinstance(h, RichHandler) for h in root.handlers):
        handler = RichHandler(console=console, show_path=False, show_time=False, markup=False)
        root.addHandler(handler)
    for h in root.handlers:
        if isinstance(h, RichHandler):
            h.setLevel(logging.WARNING if quiet else logging.INFO)
    if log_file is not None:
        if _file_handler is not None:
            root.removeHandler(_file_handler)
            _file_handler.close()
        log_file.parent.mkdir(parents=True, exist_ok=True)
        _file_handler = logging.FileHandler(log_file, encoding="utf-8")
        _file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(_file_handler)


def progress(quiet: bool = False, unit: str = "tok") -> Progress:
    """A progress bar with items done, throughput in ``unit``/s (set as task field ``rate``) and ETA."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>8.1f} " + unit + "/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=quiet,
        transient=False,
    )
