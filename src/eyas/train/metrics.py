"""Training metrics: ``train/metrics.jsonl`` always, TensorBoard event files when it is installed.

One JSON line per optimizer step (``split: train``) and per evaluation (``split: eval``). On
resume, lines past the restored step are dropped so the file reads as one run. TensorBoard
(``train/tensorboard/``) gets every number of those lines as a scalar ``<split>/<key>``, a
per-TTT-step list as ``<split>/<key>/<k>``; it is optional because the JSONL file is the record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsLog:
    def __init__(self, path: Path, enabled: bool) -> None:
        self.path, self.enabled = path, enabled
        self._board = _tensorboard(path.parent / "tensorboard") if enabled else None

    def truncate_after(self, step: int) -> None:
        if not self.enabled or not self.path.is_file():
            return
        kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        self.path.write_text("".join(line + "\n" for line in kept))

    def write(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._board is not None:
            for key, value in row.items():
                values = value if isinstance(value, list) else [value]
                for k, v in enumerate(values):
                    if isinstance(v, (int, float)) and key != "step":
                        tag = f"{row['split']}/{key}" + (f"/{k}" if isinstance(value, list) else "")
                        self._board.add_scalar(tag, v, row["step"])
            self._board.flush()


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
