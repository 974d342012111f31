"""``eyas run``, ``eyas status`` and the check every stage command makes before it starts.

Order: generate, tokenize, merge, extract (skipped when ``extract.mode: online``), train,
export, eval. Each stage writes a marker when it finishes, however it was started, and is
*current* only when that marker equals the one it would write now (:mod:`eyas.stage`), else
*stale* (the marker names settings or inputs that changed) or *missing* (it has not finished).
A stage is also stale when a stage before it is not current: it will be redone after it.

- ``eyas run`` runs every stage that is not current, in order, and skips the rest. A stage
  redone makes every later one stale, so they are redone too. Generate, tokenize and eval
  always run: they keep per-record results keyed by content and redo exactly what changed.
  Generate's records are never set aside by ``eyas run``: they may have cost money, so a change
  of sampling settings stops the run and names ``eyas generate CONFIG --redo``.
- A run that trains several drafter families (``train.drafter: [eagle3, dflash]``) shares
  every stage up to extract, then trains, exports and evaluates each family in turn, in its
  own ``<run_dir>/<family>/``; each family's steps are current, stale or missing on their
  own. When all are evaluated, :mod:`eyas.eval.families` says which decodes faster.
- A stage's own command (:func:`prepare`) refuses to start on input that is not current, and
  refuses to replace outputs made otherwise unless given ``--redo``; a longer training run
  needs no ``--redo``: it continues.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from eyas.config import ConfigError, RunConfig
from eyas.console import console
from eyas.paths import FAMILY_STAGES, RunPaths
from eyas.stage import (
    StageContract,
    StageError,
    StageState,
    check,
    digest,
    expected_marker,
    read_marker,
    take_history,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stage:
    contract: StageContract
    """Its inputs, fingerprint and outputs, declared by the stage itself."""
    call: Callable[[RunConfig, bool, bool, bool], Any]
    """(config, quiet, verify_ids, redo) -> the stage's result."""

    @property
    def name(self) -> str:
        return self.contract.name


def _stages() -> tuple[Stage, ...]:
    from eyas import eval as evaluation
    from eyas import export, extract, generate, merge, tokenize, train

    return (
        Stage(generate.CONTRACT, lambda c, quiet, v, redo: generate.run(c, quiet, redo)),
        Stage(tokenize.CONTRACT, lambda c, quiet, v, redo: tokenize.run(c, quiet, verify_ids=v)),
        Stage(merge.CONTRACT, lambda c, quiet, v, redo: merge.run(c, quiet)),
        Stage(extract.CONTRACT, lambda c, quiet, v, redo: extract.run(c, quiet, redo)),
        Stage(train.CONTRACT, lambda c, quiet, v, redo: train.run(c, quiet, redo=redo)),
        Stage(export.CONTRACT, lambda c, quiet, v, redo: export.run(c, quiet)),
        Stage(evaluation.CONTRACT, lambda c, quiet, v, redo: evaluation.run(c, quiet)),
    )


STAGES = _stages()
STAGE_NAMES = tuple(s.name for s in STAGES)


def active_stages(config: RunConfig) -> list[Stage]:
    """The stages this config runs: extract only in offline mode."""
    return [s for s in STAGES if not (s.name == "extract" and config.extract.mode == "online")]


def upstream(config: RunConfig, name: str) -> list[str]:
    """Every stage whose outputs ``name`` depends on, directly or through another, in order."""
    contracts = {s.name: s.contract for s in STAGES}
    needed, todo = set(), list(contracts[name].inputs(config))
    while todo:
        stage = todo.pop()
        if stage not in needed:
            needed.add(stage)
            todo += contracts[stage].inputs(config)
    return [s for s in STAGE_NAMES if s in needed]


@dataclass(frozen=True)
class Step:
    """A stage as a run executes it: the run's own, or one drafter family's train, export or eval
    when the run trains several families (:meth:`RunConfig.drafter_views`)."""

    stage: Stage
    config: RunConfig
    """The run's config, or the family's view of it."""

    @property
    def name(self) -> str:
        return label(self.stage.name, self.config)

    def before(self) -> list[tuple[str, Stage]]:
        """Every step this one depends on, by name, with its stage (within the same family)."""
        return [(label(u, self.config), _stage(u)) for u in upstream(self.config, self.stage.name)]


def label(stage: str, config: RunConfig) -> str:
    """A step's name: the stage's, with the family beside it for a family's own stages."""
    family = config.family_subdir
    return f"{stage} ({family})" if family is not None and stage in FAMILY_STAGES else stage


def steps(config: RunConfig, selected: list[Stage] | None = None) -> list[Step]:
    """The stages in ``selected`` (default all) as this run executes them, in order: the shared
    stages, then each drafter family's train, export and eval in turn, so the first family's
    drafter is measured before the next one trains."""
    selected = selected or list(STAGES)
    shared = [Step(s, config) for s in selected if s.name not in FAMILY_STAGES]
    per_family = [Step(s, view) for view in config.drafter_views() for s in selected if s.name in FAMILY_STAGES]
    return shared + per_family


def adoptable(view: RunConfig) -> Path | None:
    """Where the run's other layout holds a drafter trained exactly as ``view`` would train it now
    (its marker's digest equals the one train would write). A run that gains or loses a second
    drafter family moves its first family from ``<run_dir>/train`` to ``<run_dir>/<family>/train``
    or back; that drafter is adopted there, not retrained. Export and eval are not moved: their
    READMEs and reports name the drafter's path, and both are cheap to redo beside it."""
    here = RunPaths.of(view)
    if read_marker(here.marker("train")) is not None:
        return None
    other = RunPaths.layout(Path(view.run_dir), None if view.family_subdir else view.train.drafter)
    found = read_marker(other.marker("train"))
    if found is None:
        return None
    expected = expected_marker(view, _stage("train").contract, here)
    take_history(expected, found, _stage("train").contract)  # a continued drafter is adopted as it stands
    return other.train_dir if digest(found) == digest(expected) else None


def adopt(view: RunConfig) -> None:
    """Move in the drafter :func:`adoptable` finds, if any."""
    found = adoptable(view)
    if found is not None:
        place = RunPaths.of(view).train_dir
        place.parent.mkdir(parents=True, exist_ok=True)
        found.rename(place)
        log.info("%s: adopted %s, trained with the same settings and input, as %s", label("train", view), found, place)


def statuses(config: RunConfig) -> dict[str, StageState]:
    """Every active step's state, before anything runs; a step after one that is not current is
    stale too, since running it would redo it."""
    active = active_stages(config)
    states: dict[str, StageState] = {}
    for step in steps(config):
        if step.stage not in active:
            continue
        state = check(step.config, step.stage.contract, RunPaths.of(step.config))
        found = adoptable(step.config) if step.stage.name == "train" and state.status == "missing" else None
        if found is not None:
            state = StageState(
                step.stage.name, "missing", [f"made in {found} with the same settings: eyas run moves it here"]
            )
        late = behind(step, RunPaths.of(step.config), states)
        if state.status == "current" and late is not None:
            state = StageState(step.stage.name, "stale", [f"{late[0]} before it is {late[2].status}"])
        states[step.name] = state
    return states


def behind(
    step: Step, paths: RunPaths, known: dict[str, StageState], run_config: RunConfig | None = None
) -> tuple[str, Stage, StageState] | None:
    """The first step ``step`` depends on that is not current, with its state: the one answer to
    "is its input ready?" that ``eyas status``, ``eyas run`` and every stage command give.
    ``known``: states already worked out (or steps this run has just finished), by step name;
    ``run_config``: the run's own config when ``step`` is an evaluation's with overrides."""
    for name, stage in step.before():
        state = known.get(name) or check(run_config or step.config, stage.contract, paths)
        if state.status != "current":
            return name, stage, state
    return None


def behind_error(step: Step, late: tuple[str, Stage, StageState], config_path: str) -> StageError:
    """The one message for a step whose input is not ready, naming the command that mends it."""
    name, stage, state = late
    return StageError(
        f"{step.name}: its input from stage {name} is {state.status} ({state.why}); {_redo_hint(stage, state, config_path)}"
    )


def next_step(stage: Stage, state: StageState) -> str:
    """What ``eyas run`` would do with a stage in this state."""
    if state.elsewhere:
        return "skip (made on another kind of machine)"
    if stage.contract.resumes_itself:
        return "run (redoes what changed)" if state.status != "current" else "run (nothing to do)"
    if state.status == "current":
        return "skip"
    if state.extendable:
        return "continue"
    if state.repairable:
        return f"redo {len(state.damaged)} damaged unit{'s' if len(state.damaged) > 1 else ''} alone"
    return "redo" if state.status == "stale" else "run"


def status_table(config: RunConfig, selected: list[Stage] | None = None) -> Table:
    states = statuses(config)
    from eyas.space import human_bytes

    t = Table(title=f"stages of {config.run_dir}")
    for col in ("stage", "state", "why", "holds", "eyas run would"):
        t.add_column(col, justify="right" if col == "holds" else "left")
    colors = {"current": "green", "stale": "yellow", "missing": "red"}
    for step in steps(config, selected):
        if step.name not in states:
            t.add_row(step.name, "skipped", "extract.mode is online: training computes the states", "", "skip")
            continue
        state = states[step.name]
        held = human_bytes(held_bytes(RunPaths.of(step.config), step.stage.name))
        t.add_row(
            step.name, f"[{colors[state.status]}]{state.status}[/]", state.why, held, next_step(step.stage, state)
        )
    from eyas.eval.families import families_state

    if (state := families_state(config)) is not None:
        again = "skip" if state.status == "current" else "compare (after every family's eval)"
        t.add_row("families", f"[{colors[state.status]}]{state.status}[/]", state.why, "", again)
    return t


def space_line(config: RunConfig) -> str:
    """The run directory's free space, what ``eyas run`` would write next as far as it can be
    told before generating (:func:`space_needs`), and the size of eyas's cache against its limit."""
    from eyas.space import free_bytes, human_bytes

    needs, _ = space_needs(config, set(STAGE_NAMES))
    parts = ", ".join(f"{n.what} {human_bytes(n.bytes)}" for n in needs if n.bytes) or "nothing it can tell yet"
    from eyas.target import cache_root
    from eyas.target.cache import LIMIT_ENV, limit_bytes, size

    root, cache = RunPaths.of(config).root, cache_root()
    return (
        f"{root}: {human_bytes(free_bytes(root))} free; `eyas run` would write next: {parts}. eyas's cache "
        f"{cache}: {human_bytes(size(cache))} of at most {human_bytes(limit_bytes())} (${LIMIT_ENV})"
    )


def _stage(name: str) -> Stage:
    return STAGES[STAGE_NAMES.index(name)]


def _redo_hint(stage: Stage, state: StageState, config_path: str) -> str:
    redo = state.status == "stale" and not stage.contract.resumes_itself
    own = f"eyas {stage.name} {config_path}{' --redo' if redo else ''}"
    return f"run `{own}` (or `eyas run {config_path} --from {stage.name}`) first"


def require_inputs(
    config: RunConfig,
    name: str,
    config_path: str = "CONFIG",
    paths: RunPaths | None = None,
    run_config: RunConfig | None = None,
) -> None:
    """Refuse to start ``name`` on input that is missing or stale, naming the command that mends it.

    ``run_config``: the run's own config, when ``config`` is an evaluation's with command-line
    overrides — the stages it reads are the run's, and current or not under the run's config."""
    step = Step(_stage(name), config)
    late = behind(step, paths or RunPaths.of(config), {}, run_config)
    if late is not None:
        raise behind_error(step, late, config_path)


def prepare(
    config: RunConfig,
    name: str,
    redo: bool = False,
    config_path: str = "CONFIG",
    paths: RunPaths | None = None,
    run_config: RunConfig | None = None,
) -> bool:
    """Before a stage's own command: its input must be current, and outputs made otherwise are
    replaced only with ``redo`` (or when the stage continues them). False when the stage is
    current and need not run."""
    paths = paths or RunPaths.of(config)
    require_inputs(config, name, config_path, paths, run_config)
    if name == "train":
        adopt(config)
    stage = _stage(name)
    if stage.contract.resumes_itself:
        return True
    state = check(config, stage.contract, paths)
    if state.status == "current":
        log.info("%s: up to date (%s); nothing to do", name, paths.marker(name))
        return False
    if state.status == "stale" and not (redo or state.extendable or state.repairable):
        raise StageError(
            f"{name}: its outputs were made with other settings or input ({state.why}); run `eyas {name} "
            f"{config_path} --redo` to redo it (the current outputs stay whole until the new ones replace them)"
        )
    return True


def preflight(config: RunConfig, selected: list[Stage] | None = None) -> None:
    """Refuse, before the first stage spends anything, what would stop a later one of
    ``selected`` (default: all): settings a drafter family cannot train with, and a target or
    drafter the llama.cpp eyas runs cannot serve when the run exports a GGUF file (eval in
    llama.cpp) — otherwise found only after generation, extraction and training."""
    from eyas.drafter.families import FAMILIES
    from eyas.export import formats_for
    from eyas.space import require_room

    names = {stage.name for stage in (selected or STAGES)}
    require_room(RunPaths.of(config).root, *space_needs(config, names))
    for view in config.drafter_views():
        family = FAMILIES[view.train.drafter]
        if "train" in names:
            family.require_trainable(view.train)
        if names & {"export", "eval"} and "gguf" in formats_for(view):
            from eyas.target.llamacpp_support import require_served

            require_served(view.target, family, family.configured_options(view.train))


def space_needs(config: RunConfig, names: set[str]) -> tuple[list, list[str]]:
    """What the stages in ``names`` will write that can be told before generating, as
    :class:`eyas.space.Need` s, and the settings that would store less: the records still to
    write (from the prompts) and, offline, the states extraction will store (``eyas
    estimate``'s figure, less the shards already written). Training and export check theirs
    when they start, knowing the drafter."""
    from eyas import extract
    from eyas.extract.estimate import need
    from eyas.generate.expected import expected
    from eyas.space import Need

    paths = RunPaths.of(config)
    needs, levers = [], []
    if "generate" in names:
        needs.append(Need("generate: records", expected(config).record_bytes))
    stores_states = "extract" in names and config.extract.mode == "offline"
    if stores_states and check(config, extract.CONTRACT, paths).status != "current":
        written = sum(p.stat().st_size for p in paths.hidden_dir.glob("shard-*.safetensors"))
        states, levers = need(config, written)
        needs.append(states)
    return needs, levers


def held_bytes(paths: RunPaths, stage: str) -> int:
    """The bytes a stage's directory holds (training's: its checkpoints and drafters)."""
    from eyas.space import tree_bytes

    return tree_bytes(paths.train_dir if stage == "train" else paths.marker(stage).parent)


def select(first: str | None = None, last: str | None = None) -> list[Stage]:
    """Stages ``first``..``last`` (``--from``, ``--to``), in order."""
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
    """Run stages ``first``..``last`` that are not current; returns per step (:attr:`Step.name`)
    ``{stage, status, result}`` (+ ``seconds``, ``cpu_seconds`` for the steps that ran), and
    ``families``, the comparison, when every drafter family of the run was evaluated."""
    active = active_stages(config)
    selected = select(first, last)
    preflight(config, selected)
    results: dict[str, dict] = {}
    for view in config.drafter_views():
        adopt(view)
    for step in steps(config, selected):
        stage, paths = step.stage, RunPaths.of(step.config)
        if stage not in active:
            log.info("%s: skipped (extract.mode is online: training computes hidden states itself)", stage.name)
            results[step.name] = {"stage": stage.name, "status": "skipped", "result": None}
            continue
        # Steps this run has just finished are ready by construction.
        late = behind(step, paths, {name: StageState(name, "current") for name in results})
        if late is not None:
            raise behind_error(step, late, config_path)
        state = check(step.config, stage.contract, paths)
        if state.elsewhere:
            # Made where `auto` meant another dtype: redoing it here would compute something else.
            log.warning("%s: skipped, %s", step.name, state.why)
            results[step.name] = {"stage": stage.name, "status": "up to date", "result": None}
            continue
        if not stage.contract.resumes_itself:
            if state.status == "current":
                log.info("%s: up to date, skipped", step.name)
                results[step.name] = {"stage": stage.name, "status": "up to date", "result": None}
                continue
            log.info("%s: %s (%s)", step.name, next_step(stage, state), state.why)
        if not quiet:
            console.rule(step.name)
        started, cpu_started = time.monotonic(), time.process_time()
        # Outputs made otherwise are replaced, never refused, except generate's paid-for records.
        result = stage.call(step.config, quiet, verify_ids, not stage.contract.resumes_itself)
        # CPU time beside wall time: on a shared machine it is the figure that predicts an idle one.
        seconds, cpu_seconds = time.monotonic() - started, time.process_time() - cpu_started
        log.info("%s: done in %.0f s (%.0f s of CPU)", step.name, seconds, cpu_seconds)
        results[step.name] = {
            "stage": stage.name,
            "status": "ran",
            "seconds": seconds,
            "cpu_seconds": cpu_seconds,
            "result": result,
        }
    reports = {
        view.train.drafter: results.get(label("eval", view), {}).get("result") for view in config.drafter_views()
    }
    if len(reports) > 1 and all(reports.values()):
        from eyas.eval.families import report_families

        results["families"] = {"stage": "families", "status": "ran", "result": report_families(config, reports, quiet)}
    return results
