"""metrics.jsonl: a torn last line and the lines past the restored step dropped on resume, atomically;
the TensorBoard mirror."""

from __future__ import annotations

from pathlib import Path

import pytest

from eyas.train.metrics import MetricsLog, read_metrics


def three_steps(path: Path) -> Path:
    with MetricsLog(path, enabled=True) as log:
        for step in (1, 2, 3):
            log.write({"split": "train", "step": step, "loss": 1.0 / step})
        log.write({"split": "eval", "step": 3, "acc": [0.5]})
    return path


def test_a_resumed_log_drops_the_lines_past_the_restored_step(tmp_path):
    path = three_steps(tmp_path / "metrics.jsonl")
    with MetricsLog(path, enabled=True, step=2) as log:
        log.write({"split": "train", "step": 3, "loss": 0.25})
    assert [(r["step"], r["loss"]) for r in read_metrics(path)] == [(1, 1.0), (2, 0.5), (3, 0.25)]
    assert read_metrics(path, "eval") == []


def test_a_line_torn_by_a_crash_is_dropped_when_the_log_opens(tmp_path):
    """A kill in the middle of a write left half a line, and the resumed run died parsing it."""
    path = three_steps(tmp_path / "metrics.jsonl")
    with path.open("a") as f:
        f.write('{"split": "train", "step": 4, "lo')
    MetricsLog(path, enabled=True, step=3).close()
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]


def test_a_crash_while_dropping_lines_leaves_the_log_as_it_was(tmp_path, monkeypatch):
    """The log was rewritten in place: a kill half-way through the rewrite lost the lines
    the resumed run keeps."""
    path = three_steps(tmp_path / "metrics.jsonl")
    before = path.read_text()

    def killed_half_way(self, text, *args, **kwargs):
        with self.open("w") as f:
            f.write(text[: len(text) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        MetricsLog(path, enabled=True, step=1)
    monkeypatch.undo()
    assert path.read_text() == before


def test_disabled_log_writes_nothing(tmp_path):
    MetricsLog(tmp_path / "metrics.jsonl", enabled=False).write({"split": "train", "step": 1, "loss": 1.0})
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "tensorboard").exists()


def test_tensorboard_mirrors_the_numbers(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLog(tmp_path / "metrics.jsonl", enabled=True)
    log.write({"split": "train", "step": 1, "loss": 2.5, "acc": [0.25, 0.125]})
    log.write({"split": "eval", "step": 1, "acceptance_length": 1.5})
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert events.Scalars("train/loss")[0].value == 2.5
    assert events.Scalars("train/acc/1")[0].value == 0.125
    assert events.Scalars("eval/acceptance_length")[0].step == 1
