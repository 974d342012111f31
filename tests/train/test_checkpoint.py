"""Checkpoints and drafters are on disk before their names are: every file fsynced, then renamed."""

from __future__ import annotations

import json
import os
from pathlib import Path

from eyas.config import TrainConfig
from eyas.train import checkpoint
from eyas.train.optimizer import build_optimizers
from tests.train.helpers import small_drafter


def record_disk_writes(monkeypatch) -> list[tuple[str, str]]:
    """``("fsync", path)`` and ``("rename", destination)`` as they happen, in order."""
    events = []
    fsync, rename = os.fsync, os.rename

    def recorded_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recorded_rename(src, dst, *args, **kwargs):
        events.append(("rename", str(Path(dst).resolve())))
        rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "rename", recorded_rename)
    return events


def synced_before_named(events: list[tuple[str, str]], directory: Path) -> set[str]:
    """The files of ``directory`` (by name inside it) fsynced under their temporary directory
    before ``directory`` got its name."""
    named = events.index(("rename", str(directory.resolve())))
    tmp = str(directory.resolve()) + ".tmp/"
    return {path.removeprefix(tmp) for kind, path in events[:named] if kind == "fsync" and path.startswith(tmp)}


def test_a_checkpoint_and_a_drafter_are_fsynced_before_they_are_renamed_into_place(tmp_path, model, monkeypatch):
    """Checkpoints and ``train/final`` were renamed into place unsynced: after a power cut a
    complete-looking ``step-N`` could hold weights that never reached the disk."""
    drafter = small_drafter(model).train()
    optimizers = build_optimizers(drafter, TrainConfig(lr=1e-3), 1e-3, total=2)
    events = record_disk_writes(monkeypatch)

    saved = checkpoint.save(tmp_path, 1, drafter, optimizers, True, {"made": "with"}, [[0, 1]])
    assert synced_before_named(events, saved) == {p.name for p in saved.iterdir()}
    assert ("fsync", str(saved.parent.resolve())) in events[events.index(("rename", str(saved.resolve()))) :]

    events.clear()
    final = checkpoint.write_drafter(
        checkpoint.full_weights(drafter),
        drafter.spec,
        tmp_path / "final",
        lambda d: (d / "stage.json").write_text(json.dumps({"stage": "train"})),
    )
    assert synced_before_named(events, final) == {"config.json", "model.safetensors", "stage.json"}


def test_a_damaged_checkpoint_is_passed_over_for_the_one_before(tmp_path, model, caplog):
    """A checkpoint whose bytes rotted on disk was restored as it stood, and training went on
    from corrupt weights or optimizer state."""
    drafter = small_drafter(model).train()
    optimizers = build_optimizers(drafter, TrainConfig(lr=1e-3), 1e-3, total=2)
    made = {"made": "with"}
    first = checkpoint.save(tmp_path, 1, drafter, optimizers, True, made, [[0, 2]])
    second = checkpoint.save(tmp_path, 2, drafter, optimizers, True, made, [[0, 2]])
    assert checkpoint.newest_intact(tmp_path) == second and checkpoint.damaged(first) == []

    state = second / checkpoint.STATE_FILE
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0x01
    state.write_bytes(bytes(data))
    assert checkpoint.damaged(second) == [checkpoint.STATE_FILE]
    assert checkpoint.newest_intact(tmp_path) == first
    assert f"{second}: state.pt not what was written" in caplog.text
