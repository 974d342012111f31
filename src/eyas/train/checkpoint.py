"""Checkpoints with exact resume: weights, optimizer, scheduler, RNG and the data position.

``train/checkpoints/step-NNNNNNNN/`` holds the drafter in the servable SGLang layout
(``config.json`` + ``model.safetensors``, fp32, bit-exact) and ``state.pt`` with everything
else. The data position is the step number itself (see :mod:`eyas.train.data`). A checkpoint
is written under a ``.tmp`` name and renamed when complete, so a directory named ``step-*``
is always whole; the two newest are kept.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from eyas.train.layout import WEIGHTS_FILE

STATE_FILE = "state.pt"
KEEP = 2


def checkpoints_dir(train_dir: Path) -> Path:
    return train_dir / "checkpoints"


def latest(train_dir: Path) -> Path | None:
    done = sorted(p for p in checkpoints_dir(train_dir).glob("step-*") if not p.name.endswith(".tmp"))
    return done[-1] if done else None


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(train_dir: Path, step: int, drafter, optimizer, scheduler) -> Path:
    final = checkpoints_dir(train_dir) / f"step-{step:08d}"
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    drafter.save(tmp)
    torch.save(
        {"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state()},
        tmp / STATE_FILE,
    )
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(checkpoints_dir(train_dir).glob("step-*"))[:-KEEP]:
        if not old.name.endswith(".tmp"):
            shutil.rmtree(old, ignore_errors=True)
    return final


def restore(path: Path, drafter, optimizer, scheduler) -> int:
    """Load a checkpoint into live objects; returns the number of steps already done."""
    drafter.load_weights(load_file(str(path / WEIGHTS_FILE)), str(path))
    state = torch.load(path / STATE_FILE, weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return int(state["step"])
