"""Where each stage keeps its output under ``run_dir``: one place, so stages never guess."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MERGE_STATS = "stats.json"
HIDDEN_INDEX = "index.json"
"""File names also used inside directories a stage writes elsewhere first (a temporary merge
directory renamed into place) or that a reader opens by directory (hidden states)."""


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

    def tokenize_done(self, dataset: str) -> Path:
        """What a dataset's Parquet file was made from, so a rerun knows whether to redo it."""
        return self.tokenize_dir / f"{dataset}.done.json"

    @property
    def merge_dir(self) -> Path:
        return self.root / "merge"

    @property
    def merge_stats(self) -> Path:
        """Written last by merge: its presence marks a complete merge."""
        return self.merge_dir / MERGE_STATS

    @property
    def hidden_dir(self) -> Path:
        return self.root / "hidden"

    @property
    def hidden_index(self) -> Path:
        """Written by rank 0 once every shard exists."""
        return self.hidden_dir / HIDDEN_INDEX

    @property
    def train_dir(self) -> Path:
        return self.root / "train"

    @property
    def train_vocab(self) -> Path:
        """The draft vocabulary, counted once and reused on resume."""
        return self.train_dir / "vocab.safetensors"

    @property
    def train_metrics(self) -> Path:
        return self.train_dir / "metrics.jsonl"

    @property
    def train_final(self) -> Path:
        """The finished drafter (SGLang layout), what export and eval read."""
        return self.train_dir / "final"

    @property
    def export_dir(self) -> Path:
        return self.root / "export"

    def export(self, layout: str) -> Path:
        return self.export_dir / layout

    @property
    def eval_dir(self) -> Path:
        return self.root / "eval"

    @property
    def eval_report(self) -> Path:
        return self.eval_dir / "report.json"

    def stage_marker(self, stage: str) -> Path:
        """Written by ``eyas run`` when a stage finishes: its fingerprint and timing."""
        return self.root / "pipeline" / f"{stage}.json"
