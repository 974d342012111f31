"""Where each stage keeps its output under ``run_dir``: one place, so stages never guess.

A stage that redoes finished work builds the new outputs beside the current ones, in
``<dir>.redo`` (:meth:`RunPaths.rebuilding`), and swaps them in when complete
(:func:`eyas.files.replace_dir`); until then the current outputs and their marker stay whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MERGE_STATS = "stats.json"
HIDDEN_INDEX = "index.json"
MARKER = "stage.json"
DRAFT_GGUF = "draft.gguf"
"""File names also used inside directories a stage writes elsewhere first (a temporary merge
directory renamed into place) or that a reader opens by directory (hidden states)."""
REDO_SUFFIX = ".redo"
FAMILY_STAGES = ("train", "export", "eval", "tune", "scaling")
"""The stages (and ``eyas tune`` and ``eyas scaling``), and so the directories, each drafter family of a run has to itself
(``<run_dir>/<family>/``) when the run trains several; the stages before them are shared."""


@dataclass(frozen=True)
class RunPaths:
    root: Path
    moved: tuple[tuple[str, Path], ...] = ()
    """Stage directories that live elsewhere in this view: a redo being built, a named evaluation."""

    @classmethod
    def of(cls, config) -> RunPaths:
        """The layout of a loaded RunConfig's run_dir; for one family of a run that trains several
        (:meth:`eyas.config.RunConfig.drafter_views`), with that family's stage directories."""
        return cls.layout(Path(config.run_dir), config.family_subdir)

    @classmethod
    def layout(cls, root: Path, family: str | None) -> RunPaths:
        """``root``'s layout for a run of one family (``family`` None) or for ``family`` in a run of several."""
        if family is None:
            return cls(root)
        return cls(root, tuple((name, root / family / name) for name in FAMILY_STAGES))

    def stage_dir(self, name: str) -> Path:
        """The directory a stage's outputs (and its marker) are committed in."""
        return dict(self.moved).get(name, self.root / name)

    def rebuilding(self, name: str) -> RunPaths:
        """This layout with stage directory ``name`` (``hidden``, ``train``) in its redo place."""
        return self.moving(name, self.stage_dir(name).with_name(name + REDO_SUFFIX))

    def moving(self, name: str, path: Path) -> RunPaths:
        return RunPaths(self.root, (*((n, p) for n, p in self.moved if n != name), (name, path)))

    def marker(self, stage: str) -> Path:
        """A stage's marker, inside the directory its outputs are committed with, so that swapping
        that directory in swaps outputs and marker together."""
        where = {
            "generate": self.generate_dir,
            "tokenize": self.tokenize_dir,
            "merge": self.merge_dir,
            "extract": self.hidden_dir,
            "train": self.train_final,
            "export": self.export_dir,
            "eval": self.eval_dir,
        }
        return where[stage] / MARKER

    @property
    def log_file(self) -> Path:
        return self.root / "eyas.log"

    @property
    def generate_dir(self) -> Path:
        return self.stage_dir("generate")

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
        return self.stage_dir("tokenize")

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
        return self.stage_dir("merge")

    @property
    def merge_stats(self) -> Path:
        """Written last by merge: its presence marks a complete merge."""
        return self.merge_dir / MERGE_STATS

    @property
    def hidden_dir(self) -> Path:
        return self.stage_dir("hidden")

    @property
    def hidden_index(self) -> Path:
        """Written by rank 0 once every shard exists."""
        return self.hidden_dir / HIDDEN_INDEX

    @property
    def train_dir(self) -> Path:
        return self.stage_dir("train")

    @property
    def train_vocab(self) -> Path:
        """The draft vocabulary, counted once and reused on resume."""
        return self.train_dir / "vocab.safetensors"

    @property
    def train_metrics(self) -> Path:
        return self.train_dir / "metrics.jsonl"

    @property
    def train_best(self) -> Path:
        """The drafter with the best τ measured during training (see :mod:`eyas.train.tau`)."""
        return self.train_dir / "best"

    @property
    def train_plot(self) -> Path:
        return self.train_dir / "training.png"

    @property
    def train_final(self) -> Path:
        """The finished drafter (SGLang layout), what export and eval read."""
        return self.train_dir / "final"

    @property
    def export_dir(self) -> Path:
        return self.stage_dir("export")

    def export(self, layout: str) -> Path:
        return self.export_dir / layout

    @property
    def export_gguf(self) -> Path:
        """The drafter as llama.cpp serves it (``eyas export --format gguf``)."""
        return self.export("gguf") / DRAFT_GGUF

    @property
    def eval_dir(self) -> Path:
        return self.stage_dir("eval")

    @property
    def eval_report(self) -> Path:
        return self.eval_dir / "report.json"

    @property
    def scaling_dir(self) -> Path:
        """``eyas scaling``'s subsets, their drafters and its report."""
        return self.stage_dir("scaling")

    @property
    def tune_dir(self) -> Path:
        """``eyas tune``'s measurements and report (not a stage: nothing downstream reads it)."""
        return self.stage_dir("tune")
