"""metrics.jsonl truncation on resume and the TensorBoard mirror."""

from __future__ import annotations

import pytest

from eyas.train.metrics import MetricsLog, read_metrics


def test_truncate_after_drops_lines_past_the_restored_step(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl", enabled=True)
    for step in (1, 2, 3):
        log.write({"split": "train", "step": step, "loss": 1.0 / step})
    log.write({"split": "eval", "step": 3, "acc": [0.5]})
    log.truncate_after(2)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    assert read_metrics(tmp_path / "metrics.jsonl", "eval") == []


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
