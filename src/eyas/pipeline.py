"""``eyas run``: every configured stage in order, skipping what is done, refusing stale input.

Order: generate, tokenize, merge, extract (skipped when ``extract.mode: online``), train,
export, eval. Each stage declares its outputs and fingerprint (:mod:`eyas.stage`); after a
stage finishes the pipeline writes ``run_dir/pipeline/<stage>.json`` with a hash of that
fingerprint, the same one the stage's own resume check uses. A stage is

- *missing* when one of its outputs does not exist,
- *stale* when an output is older than its upstream stage's newest output, or its
  fingerprint has changed since,
- *done* otherwise, and then skipped.

A stage whose input (the previous stage's output) is missing or stale is not started: the
error names the stage to run first. Generate and eval always run: each resumes on its own,
per prompt, and guards its own settings, so rerunning them costs only a scan.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eyas.config import ConfigError, RunConfig
from eyas.console import console
from eyas.files import write_json_atomic
from eyas.paths import RunPaths
from eyas.records import content_hash
from eyas.stage import StageContract, StageError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    contract: StageContract
    """Its outputs and fingerprint, declared by the stage itself."""
    call: Callable[[RunConfig, bool, bool], Any]
    """(config, quiet, verify_ids) -> the stage's result."""
    resumes_itself: bool = False
    """Always called: the stage skips its own finished work (per prompt) and guards its settings."""

    @property
    def name(self) -> str:
        return self.contract.name

    def outputs(self, config: RunConfig, paths: RunPaths) -> list[Path]:
        return self.contract.outputs(config, paths)


def _stages() -> tuple[Stage, ...]:
    from eyas import eval as evaluation
    from eyas import export, extract, generate, merge, tokenize, train

    return (
        Stage(generate.CONTRACT, lambda c, quiet, v: generate.run(c, quiet), True),
        Stage(tokenize.CONTRACT, lambda c, quiet, v: tokenize.run(c, quiet, verify_ids=v)),
        Stage(merge.CONTRACT, lambda c, quiet, v: merge.run(c, quiet)),
        Stage(extract.CONTRACT, lambda c, quiet, v: extract.run(c, quiet)),
        Stage(train.CONTRACT, lambda c, quiet, v: train.run(c, quiet)),
        Stage(export.CONTRACT, lambda c, quiet, v: [export.run(c, f, None, quiet) for f in export.formats_for(c)]),
        Stage(evaluation.CONTRACT, lambda c, quiet, v: evaluation.run(c, quiet), True),
    )


STAGES = _stages()
STAGE_NAMES = tuple(s.name for s in STAGES)


def active_stages(config: RunConfig) -> list[Stage]:
    """The stages this config runs: extract only in offline mode."""
    return [s for s in STAGES if not (s.name == "extract" and config.extract.mode == "online")]


def _settings(config: RunConfig, stage: Stage) -> str:
    return content_hash(stage.contract.fingerprint(config))


def state(config: RunConfig, stage: Stage, upstream: Stage | None) -> tuple[str, str]:
    """(``missing`` | ``stale`` | ``done``, why) for one stage's outputs."""
    paths = RunPaths.of(config)
    outputs = stage.outputs(config, paths)
    absent = [p for p in outputs if not p.exists()]
    if absent:
        return "missing", f"{absent[0]} does not exist"
    marker = paths.stage_marker(stage.name)
    if marker.is_file() and json.loads(marker.read_text()).get("settings") != _settings(config, stage):
        return "stale", "the settings it depends on changed since it ran"
    if upstream is not None:
        inputs = [p for p in upstream.outputs(config, paths) if p.exists()]
        oldest = min(p.stat().st_mtime for p in outputs)
        newer = [p for p in inputs if p.stat().st_mtime > oldest]
        if newer:
            return "stale", f"its input {newer[0]} is newer than its output"
    return "done", "up to date"


def _select(config: RunConfig, first: str | None, last: str | None) -> list[Stage]:
    for option, name in (("--from", first), ("--to", last)):
        if name is not None and name not in STAGE_NAMES:
            raise ConfigError(f"{option}: unknown stage {name!r}; stages: {', '.join(STAGE_NAMES)}")
    lo = STAGE_NAMES.index(first) if first else 0
    hi = STAGE_NAMES.index(last) if last else len(STAGES) - 1
    if lo > hi:
        raise ConfigError(f"--from {first} comes after --to {last}")
    return list(STAGES[lo : hi + 1])


def run(
    config: RunConfig,
    quiet: bool = False,
    first: str | None = None,
    last: str | None = None,
    verify_ids: bool = False,
    config_path: str = "CONFIG",
) -> dict[str, dict]:
    """Run stages ``first``..``last``; returns per stage ``{status, result}`` (+ ``seconds``,
    ``cpu_seconds`` for the stages that ran)."""
    paths = RunPaths.of(config)
    active = active_stages(config)
    results: dict[str, dict] = {}
    for stage in _select(config, first, last):
        if stage not in active:
            log.info("%s: skipped (extract.mode is online: training computes hidden states itself)", stage.name)
            results[stage.name] = {"status": "skipped", "result": None}
            continue
        index = active.index(stage)
        upstream = active[index - 1] if index > 0 else None
        if upstream is not None and upstream.name not in results:
            status, why = state(config, upstream, active[index - 2] if index > 1 else None)
            if status != "done":
                raise StageError(
                    f"{stage.name}: its input from stage {upstream.name} is {status} ({why}); "
                    f"run `eyas run {config_path} --from {upstream.name}` first"
                )
        if not stage.resumes_itself:
            status, why = state(config, stage, upstream)
            if status == "done":
                log.info("%s: up to date, skipped", stage.name)
                results[stage.name] = {"status": "up to date", "result": None}
                continue
            log.info("%s: %s (%s)", stage.name, "running" if status == "missing" else "rerunning", why)
        if not quiet:
            console.rule(stage.name)
        started, cpu_started = time.monotonic(), time.process_time()
        result = stage.call(config, quiet, verify_ids)
        # CPU time beside wall time: on a shared machine it is the figure that predicts an idle one.
        seconds, cpu_seconds = time.monotonic() - started, time.process_time() - cpu_started
        log.info("%s: done in %.0f s (%.0f s of CPU)", stage.name, seconds, cpu_seconds)
        timing = {"seconds": seconds, "cpu_seconds": cpu_seconds}
        write_json_atomic(
            paths.stage_marker(stage.name), {"settings": _settings(config, stage), **timing, "finished": time.time()}
        )
        results[stage.name] = {"status": "ran", **timing, "result": result}
    return results
