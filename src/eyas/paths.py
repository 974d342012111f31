"""Where each stage keeps its output under ``run_dir``: one place, so stages never guess."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @classmethod
    def of(cls, config) -> RunPaths:
        """The layout of a loaded RunConfig's run_dir."""
        return cls(Path(config.run_dir))

    @property
    def log_file(self) -> Path:
        return self.root / "eyas.log"

    @property
    def generate_dir(self) -> Path:
        return self.root / "generate"

    def generations(self, dataset: str) -> Path:
        return self.generate_dir / f"{dataset}.jsonl"

    def generation_errors(self, dataset: str) -> Path:
        return self.generate_dir / f"{dataset}.errors.jsonl"

    @property
    def generate_lock(self) -> Path:
        """Held (flock) by a running HTTP generation, so two cannot buy the same prompts."""
        return self.generate_dir / ".lock"

    @property
    def ledger(self) -> Path:
        """Spending journal of the HTTP backend (reservations, spend, per dataset and provider)."""
        return self.generate_dir / "ledger.jsonl"

    @property
    def tokenize_dir(self) -> Path:
        return self.root / "tokenize"

    def tokenized(self, dataset: str) -> Path:
        return self.tokenize_dir / f"{dataset}.parquet"

    @property
    def tokenize_report(self) -> Path:
        return self.tokenize_dir / "report.json"

    @property
    def merge_dir(self) -> Path:
        return self.root / "merge"

    @property
    def hidden_dir(self) -> Path:
        return self.root / "hidden"

    @property
    def train_dir(self) -> Path:
        return self.root / "train"

    @property
    def export_dir(self) -> Path:
        return self.root / "export"

    @property
    def eval_dir(self) -> Path:
        return self.root / "eval"
