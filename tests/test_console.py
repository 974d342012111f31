"""Progress where stderr is not a terminal (nohup, schedulers, CI): log lines instead of a silent bar."""

from __future__ import annotations

import logging

from eyas.console import console, progress


def test_progress_is_logged_when_stderr_is_not_a_terminal(caplog):
    assert not console.is_terminal  # pytest captures stderr
    with caplog.at_level(logging.INFO, logger="eyas.progress"), progress(unit="tok", log_every=0.0) as bar:
        task = bar.add_task("train", total=10, rate=0.0)
        bar.update(task, completed=3, rate=250.0)
        bar.advance(task, 2)
    lines = [r.getMessage() for r in caplog.records if r.name == "eyas.progress"]
    assert lines[0].startswith("train: 3/10, 250.0 tok/s, 0:00:00 elapsed")
    assert lines[1].startswith("train: 5/10, 250.0 tok/s")


def test_quiet_progress_logs_nothing(caplog):
    with caplog.at_level(logging.INFO, logger="eyas.progress"), progress(quiet=True, log_every=0.0) as bar:
        task = bar.add_task("generate", total=4, rate=0.0)
        bar.update(task, completed=2, rate=1.0)
    assert not [r for r in caplog.records if r.name == "eyas.progress"]
