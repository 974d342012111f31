"""The contract each stage keeps with the stages after it, with ``eyas run`` and with its own reruns.

However a stage is started (``eyas run`` or its own command), it finishes by writing one marker,
``stage.json``, inside the directory its outputs are committed with (:meth:`RunPaths.marker`)::

    {"stage": "train", "format": 1,
     "fingerprint": {"train.lr": 0.0001, ...},   # every setting its outputs depend on
     "inputs": {"merge": "<digest>"},            # digests of the upstream markers it consumed
     "outputs": {...},                           # content digests of outputs appended in place (generate)
     "run": {"seconds": 12.3, ...}}              # how this run went; not part of the digest

``run.seconds`` is the last call's clock; ``run.total_seconds`` (and ``total_cpu_seconds``) is
what the outputs as they stand cost, summed over every call whose work they keep (records,
shards or checkpoints a killed or earlier run committed, a continued training run): what a
sample costs is read from it (:func:`spent`), never from the last call alone.

A marker's digest covers everything but ``run``, so markers chain: a stage is *current* only if
the marker it would write now — its fingerprint under today's config, the digests of the
markers upstream today, the content of its in-place outputs today — equals the one on disk.
Nothing compares modification times. A fingerprint is a flat mapping of config key paths, so
a mismatch is reported as the keys the user changed (``train.lr: 0.0001 → 0.0002``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eyas.config import RunConfig, TargetConfig
from eyas.files import write_json_atomic
from eyas.paths import RunPaths
from eyas.records import content_hash

MARKER_FORMAT = 1


class StageError(Exception):
    """A stage cannot go on from the run directory as it stands: its input is missing, stale or
    empty, what is already there was made otherwise, or what it computed is unusable (NaN
    states). The config itself is valid, so this is not a ``ConfigError``; the message names
    the file and what to run or delete. ``eyas`` exits with ``EXIT_CODE``."""

    EXIT_CODE = 6


@dataclass(frozen=True)
class StageContract:
    name: str
    inputs: Callable[[RunConfig], list[str]]
    """The upstream stages whose outputs (and so markers) this stage consumes under a config."""
    fingerprint: Callable[[RunConfig], dict]
    """Everything else its outputs depend on, as ``{key path: value}``; settings that change only
    speed or reporting stay out, each with a comment saying why."""
    outputs: Callable[[RunConfig, RunPaths], list[Path]]
    """Files whose existence the marker vouches for."""
    observe: Callable[[RunConfig, RunPaths], dict] | None = None
    """Content digests of outputs the stage appends to in place (generate's records), recorded in
    the marker and compared with the files as they are now."""
    extends: Callable[[dict, dict], bool] | None = None
    """Whether outputs made under the old fingerprint can be continued to the new one (a longer
    training run) instead of redone."""
    resumes_itself: bool = False
    """Always run, never refused: the stage keeps per-record results keyed by their content and
    redoes exactly what changed (generate, tokenize, eval)."""
    history: Callable[[dict], dict[str, str]] | None = None
    """How outputs were reached where no setting says it (a training run continued to a longer
    length): given a marker's fingerprint, each key there that records it, with a phrase for
    ``eyas status``. Those keys count in the digest, so later stages tell such outputs from
    fresh ones; no config sets them, so the marker expected now takes them from the one on disk
    and a current state says them."""
    damaged: Callable[[RunConfig, RunPaths], list[str]] | None = None
    """Committed units (shards) whose bytes are no longer those recorded when they were written,
    by name: the stage is stale for them alone, and redoes only them (:attr:`StageState.repairable`)."""
    resolved: Callable[[RunConfig], dict] | None = None
    """What the config's ``auto`` settings mean on this machine (``target.dtype: auto`` is
    bfloat16 on a GPU, float32 on a CPU), for stages that run the target: fingerprints keep
    ``auto``, so whether a stage is current does not depend on where ``eyas status`` runs, and
    the marker records this beside it, so another machine can say it would resolve otherwise."""


def flat(prefix: str, value: Any) -> dict:
    """A config section as ``{"section.key": value}``: a changed key is named as the user wrote it."""
    if isinstance(value, dict) and value:
        return {k: v for key, sub in value.items() for k, v in flat(f"{prefix}.{key}", sub).items()}
    return {prefix: value}


def target_identity(target: TargetConfig) -> dict:
    """Which target and tokenizer: the keys that change ids (not the device or dtype they run in)."""
    return flat("target", target.model_dump(mode="json", include={"model", "revision", "tokenizer"}))


def file_digest(path: Path) -> str:
    """The sha256 of a file's bytes (what a marker records of content, never its mtime)."""
    import hashlib

    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def digest(marker: dict) -> str:
    return content_hash({k: v for k, v in marker.items() if k != "run"})


def read_marker(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        marker = json.loads(path.read_text())
    except ValueError:
        marker = None
    if not isinstance(marker, dict):
        raise StageError(f"{path}: not a stage marker; delete it and rerun that stage")
    return marker


def expected_marker(config: RunConfig, contract: StageContract, paths: RunPaths, observe: bool = True) -> dict:
    """The marker the stage would write if it finished now (its in-place outputs observed unless
    ``observe`` is false: a stage about to run observes them when it ends)."""
    inputs = {}
    for name in contract.inputs(config):
        upstream = read_marker(paths.marker(name))
        inputs[name] = digest(upstream) if upstream is not None else None
    marker = {
        "stage": contract.name,
        "format": MARKER_FORMAT,
        "fingerprint": contract.fingerprint(config),
        "inputs": inputs,
    }
    if contract.observe is not None and observe:
        marker["outputs"] = contract.observe(config, paths)
    return marker


@dataclass
class StageRun:
    """A stage under way: the marker it will write, fixed when it started (the inputs it read
    then, not whatever is upstream when it ends), and its clock."""

    contract: StageContract
    marker: dict
    resolved: dict = field(default_factory=dict)
    """What the config's ``auto`` settings meant where it ran (:attr:`StageContract.resolved`)."""
    started: tuple[float, float] = field(default_factory=lambda: (time.monotonic(), time.process_time()))
    earlier: tuple[float, float] = (0.0, 0.0)
    """Wall and CPU seconds that earlier calls spent on outputs this one keeps (:meth:`carry`)."""

    def carry(self, seconds: float, cpu_seconds: float) -> None:
        """Count work of earlier calls that this run keeps (records, shards, a checkpoint it resumes from)."""
        self.earlier = (self.earlier[0] + seconds, self.earlier[1] + cpu_seconds)

    def spent_now(self) -> tuple[float, float]:
        """Wall and CPU seconds the outputs have cost so far: the earlier calls' and this one's."""
        wall, cpu = self.started
        return self.earlier[0] + time.monotonic() - wall, self.earlier[1] + time.process_time() - cpu

    def finish(self, path: Path, config: RunConfig | None = None, paths: RunPaths | None = None, **run) -> dict:
        """Write the marker to ``path`` (inside the outputs' directory, before it is swapped in).
        Stages with in-place outputs pass ``config`` and ``paths`` so they are observed as they
        ended. ``run`` adds facts of this run (``continued_from_step``) beside the timings."""
        from eyas import __version__

        marker = dict(self.marker)
        if self.contract.observe is not None and config is not None and paths is not None:
            marker["outputs"] = self.contract.observe(config, paths)
        wall, cpu = self.started
        total_wall, total_cpu = self.spent_now()
        marker["run"] = {
            "seconds": round(time.monotonic() - wall, 3),
            "cpu_seconds": round(time.process_time() - cpu, 3),
            "total_seconds": round(total_wall, 3),
            "total_cpu_seconds": round(total_cpu, 3),
            "finished": time.time(),
            "eyas": __version__,
            **({"resolved": self.resolved} if self.resolved else {}),
            **run,
        }
        write_json_atomic(path, marker)
        return marker


def spent(marker: dict) -> tuple[float, float]:
    """Wall and CPU seconds a finished stage's outputs cost in all (:attr:`StageRun.earlier`
    included; a marker written before totals were recorded gives its last call's)."""
    run = marker["run"]
    return run.get("total_seconds", run["seconds"]), run.get("total_cpu_seconds", run["cpu_seconds"])


def begin(config: RunConfig, contract: StageContract, paths: RunPaths) -> StageRun:
    marker = expected_marker(config, contract, paths, observe=False)
    return StageRun(contract, marker, resolved_by(config, contract, marker["fingerprint"]))


def resolved_by(config: RunConfig, contract: StageContract, fingerprint: dict) -> dict:
    """:attr:`StageContract.resolved` where the fingerprint holds an ``auto`` it resolves."""
    if contract.resolved is None or "auto" not in fingerprint.values():
        return {}
    return {k: v for k, v in contract.resolved(config).items() if fingerprint.get(k) == "auto"}


@dataclass
class StageState:
    stage: str
    status: str
    """``current``, ``stale`` or ``missing``."""
    changes: list[str] = field(default_factory=list)
    """What differs from the marker on disk, or why there is none, in the user's terms."""
    extendable: bool = False
    """Stale only by settings its outputs can be continued to (``StageContract.extends``)."""
    elsewhere: list[str] = field(default_factory=list)
    """For a current stage made on a machine where ``auto`` meant something else: what it ran
    with and what this machine would use. ``eyas run`` here leaves it as it is."""
    history: list[str] = field(default_factory=list)
    """For a current stage, how its outputs were reached where a fresh run would have made
    others (:attr:`StageContract.history`)."""
    damaged: list[str] = field(default_factory=list)
    """Units whose bytes changed since they were committed (:attr:`StageContract.damaged`)."""

    @property
    def repairable(self) -> bool:
        """Stale only by damaged units, which the stage redoes alone (nothing else changed)."""
        return bool(self.damaged) and len(self.changes) == len(self.damaged)

    @property
    def why(self) -> str:
        if self.history or self.elsewhere:
            return "up to date; " + "; ".join(self.history + self.elsewhere)
        return "; ".join(self.changes) if self.changes else "up to date"


def _resolved_otherwise(marker: dict, here: dict) -> list[str]:
    ran = marker.get("run", {}).get("resolved", {})
    return [
        f"made where {key}: auto meant {ran[key]}, here it would mean {value}: `eyas run` here leaves it as it "
        "is; to redo it, run on a machine like the one that made it"
        for key, value in here.items()
        if key in ran and ran[key] != value
    ]


def take_history(now: dict, on_disk: dict, contract: StageContract) -> dict[str, str]:
    """Put into the marker expected ``now`` the history keys the marker ``on_disk`` records
    (:attr:`StageContract.history`), so that outputs reached that way compare equal when nothing
    else changed; returns them with their phrases."""
    history = contract.history(on_disk.get("fingerprint", {})) if contract.history is not None else {}
    now["fingerprint"] |= {key: on_disk["fingerprint"][key] for key in history}
    return history


def check(config: RunConfig, contract: StageContract, paths: RunPaths) -> StageState:
    """Compare the marker on disk with the one the stage would write now."""
    name = contract.name
    path = paths.marker(name)
    on_disk = read_marker(path)
    if on_disk is None:
        return StageState(name, "missing", [f"{_shown(path, paths)} does not exist: {name} has not finished"])
    absent = [p for p in contract.outputs(config, paths) if not p.exists()]
    if absent:
        return StageState(name, "missing", [f"{_shown(absent[0], paths)} is missing"])
    now = expected_marker(config, contract, paths)
    history = take_history(now, on_disk, contract)
    changes = differences(on_disk, now)
    damaged = contract.damaged(config, paths) if contract.damaged is not None and not changes else []
    if damaged:
        said = [
            f"{unit}: its bytes are not those written (corrupted, or written since); redone alone" for unit in damaged
        ]
        return StageState(name, "stale", said, damaged=damaged)
    if not changes:
        elsewhere = _resolved_otherwise(on_disk, resolved_by(config, contract, now["fingerprint"]))
        return StageState(name, "current", history=list(history.values()), elsewhere=elsewhere)
    only_settings = on_disk.get("inputs") == now["inputs"] and on_disk.get("outputs") == now.get("outputs")
    extendable = (
        contract.extends is not None
        and on_disk.get("format") == MARKER_FORMAT
        and only_settings
        and contract.extends(on_disk.get("fingerprint", {}), now["fingerprint"])
    )
    return StageState(name, "stale", changes, extendable)


_UNSET = object()


def differences(old: dict, new: dict) -> list[str]:
    """What changed between two markers, one phrase per setting, input or output."""
    if old.get("format") != new["format"] or old.get("stage") != new["stage"]:
        return [f"made by another eyas version (marker format {old.get('format')!r}, now {new['format']})"]
    changes = []
    was, now = old.get("fingerprint", {}), new["fingerprint"]
    for key in sorted({*was, *now}):
        a, b = was.get(key, _UNSET), now.get(key, _UNSET)
        if a != b:
            changes.append(f"{key}: {_value(a)} → {_value(b)}")
    was, now = old.get("inputs", {}), new["inputs"]
    for name in sorted({*was, *now}):
        if now.get(name) is None:
            changes.append(f"its input {name} has not finished")
        elif was.get(name) != now.get(name):
            changes.append(f"its input {name} was redone since")
    was, now = old.get("outputs", {}), new.get("outputs", {})
    for name in sorted({*was, *now}):
        if was.get(name) != now.get(name):
            changes.append(f"{name} changed since {new['stage']} wrote it")
    return changes


def _value(value: Any) -> str:
    if value is _UNSET:
        return "(default)"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _shown(path: Path, paths: RunPaths) -> str:
    try:
        return str(path.relative_to(paths.root.parent))
    except ValueError:
        return str(path)
