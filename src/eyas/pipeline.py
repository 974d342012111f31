"""``eyas run``: every configured stage in order, skipping what is done, refusing stale input.

Order: generate, tokenize, merge, extract (skipped when ``extract.mode: online``), train,
export, eval. Each stage's outputs are known files under ``run_dir``; after a stage finishes
the pipeline writes ``run_dir/pipeline/<stage>.json`` with a hash of the config sections that
shape that stage's output. A stage is

- *missing* when one of its outputs does not exist,
- *stale* when an output is older than its upstream stage's newest output, or the config
  sections it was made with have changed since,
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
from eyas.paths import RunPaths
from eyas.records import content_hash

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    name: str
    sections: tuple[str, ...]
    """Config sections whose change makes this stage's output stale."""
    outputs: Callable[[RunConfig, RunPaths], list[Path]]
    """Files whose existence means the stage has finished."""
    call: Callable[[RunConfig, bool, bool], Any]
    """(config, quiet, verify_ids) -> the stage's result."""
    resumes_itself: bool = False
    """Always called: the stage skips its own finished work (per prompt) and guards its settings."""


def _generate(config, quiet, verify_ids):
    from eyas import generate

    return generate.run(config, quiet)


def _tokenize(config, quiet, verify_ids):
    from eyas import tokenize

    return tokenize.run(config, quiet, verify_ids=verify_ids)


def _merge(config, quiet, verify_ids):
    from eyas import merge

    return merge.run(config, quiet)


def _extract(config, quiet, verify_ids):
    from eyas import extract

    return extract.run(config, quiet)


def _train(config, quiet, verify_ids):
    from eyas import train

    return train.run(config, quiet)


def _export_formats(config: RunConfig) -> list[str]:
    """The SGLang layout always; vLLM's too when eval serves the export in vLLM."""
    return ["sglang", "vllm"] if config.eval.engine == "vllm" else ["sglang"]


def _export(config, quiet, verify_ids):
    from eyas import export

    return [export.run(config, f, None, quiet) for f in _export_formats(config)]


def _eval(config, quiet, verify_ids):
    from eyas import eval as evaluation

    return evaluation.run(config, quiet)


def _used(config: RunConfig) -> list[str]:
    return [d.name for d in config.datasets if not d.drop]


STAGES: tuple[Stage, ...] = (
    Stage("generate", ("target", "datasets", "generate"), lambda c, p: [p.generations(d.name) for d in c.datasets], _generate, True),
    Stage("tokenize", ("tokenize",), lambda c, p: [p.tokenize_report] + [p.tokenized(d) for d in _used(c)], _tokenize),
    Stage("merge", ("merge", "datasets"), lambda c, p: [p.merge_stats], _merge),
    Stage("extract", ("extract",), lambda c, p: [p.hidden_index], _extract),
    Stage("train", ("train", "extract"), lambda c, p: [p.train_final / "config.json", p.train_final / "model.safetensors"], _train),
    Stage("export", ("train",), lambda c, p: [p.export(f) / "config.json" for f in _export_formats(c)], _export),
    Stage("eval", ("eval",), lambda c, p: [p.eval_report], _eval, True),
)
STAGE_NAMES = tuple(s.name for s in STAGES)


def active_stages(config: RunConfig) -> list[Stage]:
    """The stages this config runs: extract only in offline mode."""
    return [s for s in STAGES if not (s.name == "extract" and config.extract.mode == "online")]


def _settings(config: RunConfig, stage: Stage) -> str:
    data = config.model_dump(mode="json")
    return content_hash({section: data[section] for section in stage.sections})


def _marker(paths: RunPaths, stage: Stage) -> Path:
    return paths.root / "pipeline" / f"{stage.name}.json"


def state(config: RunConfig, stage: Stage, upstream: Stage | None) -> tuple[str, str]:
    """(``missing`` | ``stale`` | ``done``, why) for one stage's outputs."""
    paths = RunPaths.of(config)
    outputs = stage.outputs(config, paths)
    absent = [p for p in outputs if not p.exists()]
    if absent:
        return "missing", f"{absent[0]} does not exist"
    marker = _marker(paths, stage)
    if marker.is_file() and json.loads(marker.read_text()).get("settings") != _settings(config, stage):
        return "stale", f"config sections {', '.join(stage.sections)} changed since it ran"
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
                raise ConfigError(
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
        marker = _marker(paths, stage)
        marker.parent.mkdir(parents=True, exist_ok=True)
        timing = {"seconds": seconds, "cpu_seconds": cpu_seconds}
        marker.write_text(json.dumps({"settings": _settings(config, stage), **timing, "finished": time.time()}))
        results[stage.name] = {"status": "ran", **timing, "result": result}
    return results
