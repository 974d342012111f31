"""Checkpoints with exact resume: weights, optimizer, scheduler, RNG and the data position.

``train/checkpoints/step-NNNNNNNN/`` holds the drafter in the servable SGLang layout
(``config.json`` + ``model.safetensors``, fp32, bit-exact), ``state.pt`` with everything
else, and ``made_with.json``: what the run was made with (data digests, hyperparameters), read
without loading the optimizer state to decide whether a checkpoint may be continued. The data
position is the step number itself (see :mod:`eyas.train.data`). A checkpoint is written under
a ``.tmp`` name, fsynced and renamed when complete (:func:`eyas.files.replace_dir`), so a
directory named ``step-*`` is always whole, even after a power cut; the two newest are kept.

States are gathered to full tensors with ``torch.distributed.checkpoint.state_dict``, which
is a plain copy for one process or DDP and an all-gather under FSDP: every rank calls
:func:`save`, rank 0 writes.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from eyas.drafter.families import save_weights
from eyas.drafter.layout import WEIGHTS_FILE
from eyas.drafter.parts import saved_only
from eyas.files import naming, replace_dir
from eyas.stage import StageError, differences, file_digest
from eyas.train.optimizer import Optimizers

log = logging.getLogger(__name__)

STATE_FILE = "state.pt"
MADE_WITH_FILE = "made_with.json"
DIGESTS_FILE = "digests.json"
"""In each checkpoint: the sha256 of every other file in it, recorded when it was written."""
KEEP = 2


def checkpoints_dir(train_dir: Path) -> Path:
    return train_dir / "checkpoints"


def step_name(step: int) -> str:
    """A checkpoint's directory name: ``step-00000240``."""
    return f"step-{step:08d}"


def finished(train_dir: Path) -> list[Path]:
    """The whole checkpoints, oldest first (a ``.tmp`` one was cut short)."""
    return sorted(p for p in checkpoints_dir(train_dir).glob("step-*") if not p.name.endswith(".tmp"))


def latest(train_dir: Path) -> Path | None:
    done = finished(train_dir)
    return done[-1] if done else None


def newest_intact(train_dir: Path) -> Path | None:
    """The newest checkpoint whose files are those it was written with (:data:`DIGESTS_FILE`);
    a damaged one is named in a warning and passed over, so the run redoes its steps from the
    one before rather than train on from corrupt weights or optimizer state."""
    for path in reversed(finished(train_dir)):
        bad = damaged(path)
        if not bad:
            return path
        log.warning(
            "%s: %s not what was written (corrupted on disk?); resuming from an earlier checkpoint",
            path,
            ", ".join(bad),
        )
    return None


def damaged(path: Path) -> list[str]:
    """Files of a checkpoint whose sha256 is not the one recorded when it was written (none for a
    checkpoint an older eyas wrote without digests)."""
    file = path / DIGESTS_FILE
    if not file.is_file():
        return []
    recorded = json.loads(file.read_text())
    return [name for name, sha in recorded.items() if not (path / name).is_file() or file_digest(path / name) != sha]


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


def full_state(drafter, optimizers: Optimizers) -> tuple[dict[str, torch.Tensor], dict]:
    """Saved weights and the optimizers' state as full CPU tensors (collective under FSDP)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights, optim = get_state_dict(drafter, optimizers.optimizers, options=options)
    return saved_only(weights), optim


def full_weights(drafter) -> dict[str, torch.Tensor]:
    """The saved weights alone as full CPU tensors (collective under FSDP)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return saved_only(get_model_state_dict(drafter, options=options))


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The weights a checkpoint or :func:`write_drafter` wrote."""
    return load_file(str(directory / WEIGHTS_FILE))


def write_drafter(weights: dict[str, torch.Tensor], spec, out: Path, seal: Callable[[Path], object]) -> Path:
    """The drafter alone (its family's own layout), written aside, sealed (``seal`` writes the stage's
    marker into the finished directory) and swapped in whole."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_weights(weights, spec, tmp)
    seal(tmp)
    replace_dir(tmp, out)
    return out


def made_with(path: Path) -> dict | None:
    """What a checkpoint was made with (None for one an older eyas wrote)."""
    file = path / MADE_WITH_FILE
    return json.loads(file.read_text()) if file.is_file() else None


def save(
    train_dir: Path,
    step: int,
    drafter,
    optimizers: Optimizers,
    is_main: bool,
    made: dict,
    schedules: list[list[int]],
    spent: tuple[float, float] = (0.0, 0.0),
) -> Path:
    """``schedules``: each learning-rate schedule the run has followed (``Trainer.schedules``);
    ``spent``: the wall and CPU seconds the run has cost up to this step, over every call that
    trained it (:meth:`eyas.stage.StageRun.spent_now`), which a resumed run carries on from."""
    final = checkpoints_dir(train_dir) / step_name(step)
    weights, optim = full_state(drafter, optimizers)
    if not is_main:
        return final
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    state = {
        "step": step,
        "optimizer": optim,
        "scheduler": optimizers.schedulers[0].state_dict(),
        "schedulers": [scheduler.state_dict() for scheduler in optimizers.schedulers],
        "rng": rng_state(),
        "schedules": schedules,
        "spent": list(spent),
    }
    try:
        save_weights(weights, drafter.spec, tmp)
        # Through a Python file, so a full disk is the OSError (ENOSPC) it is, not torch's RuntimeError.
        with (tmp / STATE_FILE).open("wb") as f:
            torch.save(state, f)
        (tmp / MADE_WITH_FILE).write_text(json.dumps(made, indent=2))
        digests = {p.name: file_digest(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / DIGESTS_FILE).write_text(json.dumps(digests, indent=2))
    except OSError as e:
        # A checkpoint the disk could not hold is not left half-written, taking the room a resume needs.
        shutil.rmtree(tmp, ignore_errors=True)
        raise naming(e, tmp) from None
    shutil.rmtree(final, ignore_errors=True)
    replace_dir(tmp, final)
    for old in sorted(checkpoints_dir(train_dir).glob("step-*"))[:-KEEP]:
        if not old.name.endswith(".tmp"):
            shutil.rmtree(old, ignore_errors=True)
    return final


def restore(
    path: Path, drafter, optimizers: Optimizers, made: dict
) -> tuple[int, list[list[int]], tuple[float, float]]:
    """Load a checkpoint into live objects (every rank reads it); returns the steps already done,
    the learning-rate schedules followed so far and the seconds they cost (:func:`save`).

    Refuses a checkpoint made with other data or settings than ``made``: continuing it would be
    neither the old run nor the new one."""
    saved = made_with(path)
    if saved != made:
        changes = "; ".join(differences(saved, made)) if saved else "made by an older eyas"
        raise StageError(f"{path}: made with other data or settings ({changes}); run `eyas train CONFIG --redo`")
    state = torch.load(path / STATE_FILE, weights_only=False)
    weights = read_weights(path)
    drafter.check_weights(weights, str(path))
    set_state_dict(
        drafter,
        optimizers.optimizers,
        model_state_dict=weights,
        optim_state_dict=state["optimizer"],
        options=StateDictOptions(full_state_dict=True, strict=False),
    )
    # One schedule per optimizer; a checkpoint from before Muon has the one.
    for scheduler, saved in zip(optimizers.schedulers, state.get("schedulers") or [state["scheduler"]], strict=True):
        keep_schedule(scheduler, saved)
    set_rng_state(state["rng"])
    # A checkpoint written before schedules were recorded followed its saved schedule from step 0.
    schedules = state.get("schedules") or [[0, state["scheduler"]["lr_lambdas"][0]["total"]]]
    wall, cpu = state.get("spent", (0.0, 0.0))
    return int(state["step"]), schedules, (wall, cpu)


def keep_schedule(scheduler, saved: dict) -> None:
    """Restore the scheduler's position but keep its schedule: LambdaLR saves its multiplier
    object's fields, which would bring back the old run's length, so a longer run would go on
    at the learning rate its shorter schedule ended with (zero). The optimizer's rates are then
    recomputed at the restored step; for a resume of the same run they are the saved ones."""
    schedules = [dict(vars(f)) for f in scheduler.lr_lambdas]
    scheduler.load_state_dict(saved)
    for multiplier, fields in zip(scheduler.lr_lambdas, schedules):
        vars(multiplier).update(fields)
    for group, base, multiplier in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * multiplier(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
