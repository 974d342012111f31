"""Logging and progress: logs go to stderr and ``<run_dir>/eyas.log``; progress bars use rich."""

from __future__ import annotations

import logging
import sys
import time
from datetime import timedelta
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
log = logging.getLogger("eyas.progress")

LOG_EVERY_S = 60.0
"""How often progress is logged where stderr is not a terminal."""


class RunLog(logging.FileHandler):
    """``<run_dir>/eyas.log``: a copy of what stderr shows. On a full disk a line is lost from
    the file alone; the traceback logging prints for each failed line would bury the one message
    that says the disk is full and how to go on."""

    def handleError(self, record: logging.LogRecord) -> None:
        from eyas.space import is_disk_full

        if not is_disk_full(sys.exc_info()[1]):
            super().handleError(record)


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
        _file_handler = RunLog(log_file, encoding="utf-8")
        _file_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(_file_handler)


class LoggedProgress(Progress):
    """Rich's live bar on a terminal; elsewhere a log line every ``log_every`` seconds.

    Where stderr is a file or a pipe (``nohup``, a batch scheduler, CI), rich draws the bar only
    when it stops, so an hour-long stage would leave its log silent until the end. There the
    progress goes to the log instead, and so into ``<run_dir>/eyas.log`` as well.
    """

    def __init__(self, *columns, unit: str, log_every: float, **kwargs):
        super().__init__(*columns, **kwargs)
        self.unit = unit
        self.log_every = None if self.console.is_terminal or self.disable else log_every
        self.logged_at = time.monotonic()

    def update(self, task_id, **kwargs) -> None:
        super().update(task_id, **kwargs)
        self._log_if_due()

    def advance(self, task_id, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._log_if_due()

    def _log_if_due(self) -> None:
        if self.log_every is None or time.monotonic() - self.logged_at < self.log_every:
            return
        self.logged_at = time.monotonic()
        for task in self.tasks:
            if task.finished:
                continue
            done = f"{task.completed:,.0f}/{task.total:,.0f}" if task.total else f"{task.completed:,.0f}"
            left = f", ~{timedelta(seconds=round(task.time_remaining))} left" if task.time_remaining is not None else ""
            rate = task.fields.get("rate")
            speed = f", {rate:,.1f} {self.unit}/s" if rate else ""
            log.info(
                "%s: %s%s, %s elapsed%s",
                task.description,
                done,
                speed,
                timedelta(seconds=round(task.elapsed or 0)),
                left,
            )


def progress(quiet: bool = False, unit: str = "tok", log_every: float = LOG_EVERY_S) -> Progress:
    """A progress bar with items done, throughput in ``unit``/s (set as task field ``rate``) and ETA."""
    return LoggedProgress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>8.1f} " + unit + "/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=quiet,
        transient=False,
        unit=unit,
        log_every=log_every,
    )
