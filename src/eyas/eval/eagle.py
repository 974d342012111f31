"""The drafter eval decodes with, read from an export or a training checkpoint."""

from __future__ import annotations

from pathlib import Path

from eyas.stage import StageError


def load_drafter(directory: Path, target_model):
    """The drafter saved in ``directory`` (export or training checkpoint) on the target's device."""
    from eyas.drafter.families import load_drafter as load_any

    if not (directory / "config.json").is_file():
        raise StageError(
            f"eval: {directory} holds no drafter (no config.json); run `eyas train` and `eyas export`, or pass --draft DIR"
        )
    drafter = load_any(directory, target_model)
    drafter.eval().requires_grad_(False)
    return drafter
