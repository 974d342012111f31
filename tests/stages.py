"""Markers for stages a test made by hand: a fixture that writes a merged corpus directly, as
merge would, declares it merge's output with the stage's own marker code, so the commands that
check their input (``eyas train``, ``eyas export``) accept it as they would a real merge's."""

from __future__ import annotations

from eyas.config import RunConfig
from eyas.paths import RunPaths
from eyas.pipeline import STAGES
from eyas.stage import begin


def mark_finished(config: RunConfig, *names: str) -> None:
    """Write the marker of each named stage, in order, as if it had just finished."""
    paths = RunPaths.of(config)
    for stage in STAGES:
        if stage.name in names:
            begin(config, stage.contract, paths).finish(paths.marker(stage.name), config, paths)
