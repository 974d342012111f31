"""The drafter eval decodes with, read from an export or a training checkpoint."""

from __future__ import annotations

from pathlib import Path


def load_drafter(directory: Path, target_model):
    """The drafter saved in ``directory`` (export or training checkpoint) on the target's device;
    :func:`eyas.eval.run` has already refused a directory that holds none."""
    from eyas.drafter.families import load_drafter as load_any

    drafter = load_any(directory, target_model)
    drafter.eval().requires_grad_(False)
    return drafter
