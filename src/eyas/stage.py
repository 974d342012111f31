"""The contract each stage keeps with ``eyas run`` and with its own reruns.

A stage declares, once, the files whose existence means it finished (``outputs``) and the
fingerprint of everything those files depend on besides its input stage's files
(``fingerprint``: config keys, the target's and tokenizer's identity). The stage's own resume
check and ``eyas run``'s staleness check use that same fingerprint, so they cannot disagree
about whether a change (``target.tokenizer``, ``generate.stop``, ...) calls for a redo.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eyas.config import RunConfig, TargetConfig
from eyas.paths import RunPaths


class StageError(Exception):
    """A stage cannot go on from the run directory as it stands: its input is missing, stale or
    empty, what is already there was made otherwise, or what it computed is unusable (NaN
    states). The config itself is valid, so this is not a ``ConfigError``; the message names
    the file and what to run or delete. ``eyas`` exits with ``EXIT_CODE``."""

    EXIT_CODE = 6


@dataclass(frozen=True)
class StageContract:
    name: str
    outputs: Callable[[RunConfig, RunPaths], list[Path]]
    """Files whose existence means the stage has finished."""
    fingerprint: Callable[[RunConfig], dict]
    """Everything the outputs depend on besides the input stage's files."""


def target_identity(target: TargetConfig) -> dict:
    """Which target and tokenizer: the keys that change ids and states (not the device they run on)."""
    return target.model_dump(mode="json", include={"model", "revision", "tokenizer"})
