"""Training metrics: ``train/metrics.jsonl`` always, TensorBoard event files when it is installed.

One JSON line per optimizer step (``split: train``), per evaluation (``split: eval``) and per τ
measurement (``split: tau``), appended as :mod:`eyas.jsonl` appends: one write per line, fsynced
at least every second and when the log closes, and a line torn by a crash dropped when the log
is next opened. A resumed run drops the lines past the step it restored, so the file reads as
one run; that rewrite is atomic, so a crash during it leaves the file as it was. TensorBoard
(``train/tensorboard/``) gets every number of those lines as a scalar ``<split>/<key>``, a
per-TTT-step list as ``<split>/<key>/<k>``; it is optional because the JSONL file is the record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eyas.files import write_text_atomic
from eyas.jsonl import DurableAppender, recover


class MetricsLog:
    """The log of a run resumed at ``step`` (0: from the start), written by the rank that is
    ``enabled`` and a no-op on the others."""

    def __init__(self, path: Path, enabled: bool, step: int = 0) -> None:
        self._out: DurableAppender | None = None
        self._board = None
        if not enabled:
            return
        recover(path)
        _drop_after(path, step)
        self._out = DurableAppender(path)
        self._board = _tensorboard(path.parent / "tensorboard")

    def write(self, row: dict[str, Any]) -> None:
        if self._out is None:
            return
        self._out.write(json.dumps(row))
        if self._board is not None:
            for key, value in row.items():
                values = value if isinstance(value, list) else [value]
                for k, v in enumerate(values):
                    if isinstance(v, (int, float)) and key != "step":
                        tag = f"{row['split']}/{key}" + (f"/{k}" if isinstance(value, list) else "")
                        self._board.add_scalar(tag, v, row["step"])
            self._board.flush()

    def close(self) -> None:
        """Every line on disk; closing again does nothing."""
        if self._out is not None:
            self._out.close()
        if self._board is not None:
            self._board.close()

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _drop_after(path: Path, step: int) -> None:
    if not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= step]
    if len(kept) < len(lines):
        write_text_atomic(path, "".join(kept))


def _tensorboard(directory: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(directory))


def read_metrics(path: Path, split: str = "train") -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [r for r in rows if r["split"] == split]
