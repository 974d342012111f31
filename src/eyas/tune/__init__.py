"""``eyas tune CONFIG``: the ``llama-server`` settings that decode fastest with the drafter on
this machine, and whether serving it pays at all.

Consumes the exported drafter (``--draft DIR``, default eval's) and prompts (the held-out split
or ``--prompts FILE``, ``tune.max_prompts`` of them), served beside the target file
``tune.target_gguf`` names (``--target-gguf``: by default the target converted to its
checkpoint's precision; ``shipped``, the quantized file it ships as; or a path). Races cells
(:mod:`eyas.tune.plan`): plain decoding, llama.cpp's n-gram methods and the drafter at draft
lengths × ``--spec-draft-p-min`` (the family's own threshold) × threads × the drafter's GGUF
type (``tune.draft_types``), then the best setting at several requests in flight,
each round side by side (:mod:`eyas.tune.rounds`), until the best stands apart or
``tune.budget_min`` runs out. Every cell's output is checked against plain greedy decoding
(float ties told apart as eval does, :mod:`eyas.eval.llamacpp_engine`); a cell that differs is
never recommended.

Produces ``<run_dir>/tune/report.json``, ``speedup.png``, a printed table, and, for the run's
own export, a "Tuned on this machine" section in ``export/gguf/README.md`` with the exact
command — or the statement that this drafter should not be served here.

Rounds are appended to ``tune/rounds-<key>.jsonl`` as they finish, keyed by the drafter's GGUF
files and the target's, the llama.cpp build, the thread counts, the machine and every setting
that shapes a round: an interrupted tune resumes where it stopped (its decisions are replayed
from the rounds), and none of another drafter, build, thread count or machine is ever read.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

from eyas.config import RunConfig
from eyas.files import write_text_atomic
from eyas.jsonl import DurableAppender, read_jsonl, recover
from eyas.paths import RunPaths
from eyas.records import content_hash
from eyas.tune import plan
from eyas.tune.plan import PLAIN, Cell, Estimate

log = logging.getLogger(__name__)


@dataclass
class Served:
    """What every round serves: the build, the target's GGUF file, the drafter's in each GGUF type
    raced (type -> file, the first the coarse grid's), its spec type, the prompts."""

    llamacpp: object
    target: Path
    drafts: dict[str, Path]
    spec_type: str
    prompts: list


@dataclass
class Race:
    """Every round so far, replayed from the rounds file before any is measured."""

    recorded: list[dict]
    appender: DurableAppender
    budget_s: float
    rounds: list[dict] = field(default_factory=list)
    exhausted: bool = False
    diverged: bool = False
    """A recorded round was not the one the race measures next: the file is rewritten to the race's own rounds."""

    @property
    def spent_s(self) -> float:
        return sum(r["seconds"] for r in self.rounds)


def run(config: RunConfig, quiet: bool = False) -> dict:
    """Tune and return the report (also written to ``tune/report.json``)."""
    from eyas import eval as evaluation
    from eyas.drafter.families import family_at, options_set
    from eyas.eval.prompts import load_eval_prompts
    from eyas.target import load_tokenizer
    from eyas.target.llamacpp import draft_gguf
    from eyas.target.llamacpp_support import require_served

    cfg = config.tune
    paths = RunPaths.of(config)
    drafter_dir = evaluation.draft_dir(config)
    evaluation.require_drafter(config, drafter_dir)
    family = family_at(drafter_dir)
    require_served(config.target, family, options_set(drafter_dir))
    spec = evaluation.drafter_spec(config, drafter_dir)
    longest = spec.draft_length(cfg.max_draft_tokens)
    p_mins = family.llamacpp_p_mins(spec, cfg.p_min)
    prompt_config = config.model_copy(update={"eval": config.eval.model_copy(update={"max_prompts": cfg.max_prompts})})
    prompts = load_eval_prompts(prompt_config, load_tokenizer(config.target))
    llamacpp, ggufs = evaluation.served_target_ggufs(config)
    export_type = config.export.gguf_type or ggufs.outtype
    types = cfg.draft_types or [export_type, "f16", "q8_0"]
    drafts = {t: draft_gguf(llamacpp, drafter_dir, ggufs, t) for t in dict.fromkeys(types)}
    target = served_target(cfg.target_gguf, ggufs, config.target.model)
    served = Served(llamacpp, target, drafts, family.llamacpp_spec_type, prompts)
    threads = cfg.threads or sorted({os.cpu_count() or 1, max(1, (os.cpu_count() or 1) // 2)}, reverse=True)
    measured_by = {
        "llama-server": llamacpp.build_identity(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "threads": threads,
    }
    key = {
        "drafts": [d.name for d in drafts.values()],
        "target": file_identity(target),
        "prompts": [content_hash(p.input_ids) for p in prompts],
        "settings": cfg.model_dump(mode="json", exclude={"budget_min", "threads"}),
        "measured_by": measured_by,
    }
    paths.tune_dir.mkdir(parents=True, exist_ok=True)
    rounds_path = paths.tune_dir / f"rounds-{content_hash(key)}.jsonl"
    if rounds_path.exists():
        recover(rounds_path)
    recorded = [row for _, row in read_jsonl(rounds_path)] if rounds_path.exists() else []
    with DurableAppender(rounds_path) as appender:
        race = Race(recorded, appender, cfg.budget_min * 60)
        result = _tune(config, served, race, threads, longest, p_mins, paths.tune_dir)
    if race.diverged or race.recorded:
        write_text_atomic(rounds_path, "".join(json.dumps(r) + "\n" for r in race.rounds))
    report = {
        "drafter": str(drafter_dir),
        "family": family.name,
        "spec_type": family.llamacpp_spec_type,
        "drafts": {t: str(d) for t, d in drafts.items()},
        "export_type": export_type,
        "target": str(target),
        "prompts": len(prompts),
        "max_new_tokens": cfg.max_new_tokens,
        "measured_by": measured_by,
        "rounds_file": rounds_path.name,
        "budget": {"minutes": cfg.budget_min, "spent_s": race.spent_s, "exhausted": race.exhausted},
        **result,
    }
    from eyas.tune.report import finish

    return finish(config, report, paths, llamacpp, quiet)


def served_target(choice: str | None, ggufs, model: str) -> Path:
    """The target file ``tune.target_gguf`` names (see :class:`eyas.config.TuneConfig`)."""
    from eyas.config import ConfigError

    if choice is None:
        return ggufs.same_precision
    if choice == "shipped":
        if ggufs.shipped is None:
            raise ConfigError(
                f"tune.target_gguf: shipped: the target {model!r} does not ship as a GGUF file; name the "
                "path of the GGUF you serve, or leave the key out to tune on its converted checkpoint"
            )
        return ggufs.shipped
    path = Path(choice).expanduser()
    if not path.is_file() or path.suffix != ".gguf":
        raise ConfigError(f"tune.target_gguf: {choice!r} is not a GGUF file (a path ending .gguf, or `shipped`)")
    return path.resolve()


def file_identity(path: Path) -> str | dict:
    """A target file as a rounds key holds it: a conversion in eyas's cache by its name, which
    holds its content (the cache touches what it serves, so its time says nothing); any other
    file by its name, size and modification time, so a file replaced under the same name is
    measured afresh without reading gigabytes to hash it."""
    from eyas.target import cache_root

    if path.parent == cache_root() / "gguf":
        return path.name
    stat = path.stat()
    return {"name": path.name, "bytes": stat.st_size, "modified_ns": stat.st_mtime_ns}


def _tune(config, served: Served, race: Race, threads: list[int], longest: int, p_mins: list[float], out_dir: Path):
    """The three phases, each a race, and what they found."""
    cfg = config.tune
    first = threads[0]
    checks = Lossless(config, served, out_dir, first)
    types = list(served.drafts)
    coarse = plan.coarse(first, longest, p_mins, types[0])
    phases = [_phase("coarse", coarse, config, served, race, checks, first)]
    best = _best(race, checks, first, drafted=True)
    if best is not None and not race.exhausted:
        baseline = _best(race, checks, first, drafted=False)
        cells = [best, baseline, *plan.refine(best, longest, p_mins, cfg.p_min_step, threads, types)]
        phases.append(_phase("refine", list(dict.fromkeys(cells)), config, served, race, checks, first))
        best = _best(race, checks, first, drafted=True)
    baseline = _best(race, checks, first, drafted=False)
    if best is not None and cfg.in_flight and not race.exhausted:
        cells = plan.load(best, baseline, cfg.in_flight, longest)
        phases.append(_phase("load", cells, config, served, race, checks, first))
    estimates = _estimates(race.rounds, first, cfg.confidence)
    found = {c.key: {**_figures(c, e, race.rounds), "lossless": checks.result(c)} for c, e in estimates.items()}
    loads: dict[int, Estimate] = {}
    for cell, e in estimates.items():
        fastest = loads.get(cell.in_flight)
        if cell.drafted and checks.passes(cell) and (fastest is None or e.speedup > fastest.speedup):
            loads[cell.in_flight] = e
    return {
        "phases": phases,
        "cells": found,
        "best": best.key if best is not None else None,
        "baseline": baseline.key,
        "in_flight": {str(k): e.speedup for k, e in sorted(loads.items())},
        "crossover": plan.crossover(loads),
        "batched_departures": checks.batched_departures(),
    }


BUDGET_SHARES = {"coarse": 0.5, "refine": 0.8, "load": 1.0}
"""How much of the budget the race may have spent by the end of each phase: a coarse grid of
near-equal cells would otherwise spend it all before the refinement and the load are measured."""


def _phase(name: str, cells: list[Cell], config, served: Served, race: Race, checks, first: int) -> dict:
    """Rounds of ``cells`` (and their anchors) until the leader of each load stands apart, the
    rounds run out, or the phase's share of the budget does (:data:`BUDGET_SHARES`); what the
    phase measured and decided."""
    from eyas.tune.rounds import measure_round

    cfg = config.tune
    active = set(cells)
    taken = 0
    separated = False
    while taken < cfg.max_rounds and not (taken >= cfg.min_rounds and separated):
        measuring = sorted(active | {c.anchor(first) for c in active})
        if race.recorded and _replays(race.recorded[0], name, measuring):
            round_ = race.recorded.pop(0)
        else:
            race.diverged |= bool(race.recorded)
            race.recorded.clear()
            upcoming = race.spent_s + _expected_s(race, measuring)
            if upcoming > race.budget_s * BUDGET_SHARES[name]:
                race.exhausted = upcoming > race.budget_s
                break
            started = time.monotonic()
            measured = measure_round(
                config,
                served.llamacpp,
                served.target,
                served.drafts,
                served.spec_type,
                measuring,
                served.prompts,
                checks.out_dir,
            )
            round_ = {"phase": name, "seconds": time.monotonic() - started, "cells": measured}
            race.appender.write_json(round_)
        race.rounds.append(round_)
        taken += 1
        log.info("tune: %s round %d, %d cells", name, taken, len(measuring))
        checks.add(round_)
        estimates = _estimates([r for r in race.rounds if r["phase"] == name], first, cfg.confidence)
        separated = True
        for load in {c.in_flight for c in active}:
            group = {c: e for c, e in estimates.items() if c.in_flight == load}
            eligible = {c for c in group if checks.passes(c)}
            if not eligible:
                continue
            outcome = plan.race(group, eligible)
            active -= outcome.dropped - {c.anchor(first) for c in group}
            separated &= outcome.separated
    return {"name": name, "rounds": taken, "separated": separated, "cells": [c.key for c in cells]}


def _replays(recorded: dict, phase: str, cells: list[Cell]) -> bool:
    """Whether a recorded round is the one this point of the race measures (it is, unless the
    rounds file was edited: then the race measures afresh from here)."""
    return recorded["phase"] == phase and set(recorded["cells"]) == {c.key for c in cells}


def _expected_s(race: Race, cells: list[Cell]) -> float:
    """The next round's time, from the last one's per cell (0 before any: the first always runs)."""
    if not race.rounds:
        return 0.0
    last = race.rounds[-1]
    return last["seconds"] / len(last["cells"]) * len(cells)


def _estimates(rounds: list[dict], first: int, confidence: float) -> dict[Cell, Estimate]:
    pooled: dict[Cell, list[float]] = {}
    for round_ in rounds:
        for key in round_["cells"]:
            cell = Cell.from_key(key)
            pooled.setdefault(cell, []).extend(plan.ratios(round_["cells"], cell, first))
    return {cell: plan.estimate(r, confidence) for cell, r in pooled.items() if r}


def _best(race: Race, checks: Lossless, first: int, drafted: bool) -> Cell | None:
    """The fastest single-stream cell whose outputs were plain's, over every round so far: with
    the drafter (None if none passed), or without it (plain at some thread count or an n-gram
    method; plain with the first thread count if nothing else passed)."""
    estimates = _estimates(race.rounds, first, checks.config.tune.confidence)
    cells = [c for c in estimates if c.in_flight == 1 and c.drafted == drafted and checks.passes(c)]
    fastest = max(cells, key=lambda c: (estimates[c].speedup, c), default=None)
    return fastest if fastest is not None or drafted else Cell(PLAIN, first)


def _figures(cell: Cell, e: Estimate, rounds: list[dict]) -> dict:
    """A cell's speed-up with its interval, its own tokens per second, and τ from llama.cpp's counters."""
    mine = [r["cells"][cell.key] for r in rounds if cell.key in r["cells"]]
    tokens = sum(t for m in mine for t, _ in m["waves"])
    seconds = sum(s for m in mine for _, s in m["waves"])
    drafts = sum(m["counters"].get("num_drafts", 0.0) for m in mine)
    accepted = sum(m["counters"].get("num_accepted_tokens", 0.0) for m in mine)
    return {
        "speedup": e.speedup,
        "low": e.low,
        "high": e.high,
        "samples": e.samples,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "tau": 1 + accepted / drafts if drafts else None,
    }


class Lossless:
    """Every cell's outputs against plain greedy decoding (the anchor's first round), round by
    round as eval checks its own (:func:`eyas.eval.llamacpp_engine.lossless`), float ties told
    apart by plain's top two log-probabilities (asked of a plain server once per prompt that
    ever differs).

    With requests in flight, llama.cpp decodes the wave in one batch, whose kernels can round
    otherwise than one-at-a-time decoding: on a quantized target (the shipped Q4_1), plain
    decoding itself departs from its single-stream outputs on some prompts. A cell at a load is
    therefore held to plain decoding at that load too: an output equal to either is plain's.
    Where plain decoding in flight departs from single-stream (:meth:`batched_departures`), the
    report says so; it is the engine's, with or without a drafter."""

    def __init__(self, config, served: Served, out_dir: Path, first: int):
        self.config, self.served, self.out_dir, self.first = config, served, out_dir, first
        self.reference: dict[str, list[int]] | None = None
        self.batched: dict[int, dict[str, list[int]]] = {}
        """Plain decoding's outputs at each load above one (its first round at that load)."""
        self.top2: dict[str, tuple] = {}
        self.outputs: dict[Cell, list[dict[str, list[int]]]] = {}
        """Each cell's outputs (prompt id -> tokens), one mapping per round it was measured in."""

    def add(self, round_: dict) -> None:
        from eyas.eval.llamacpp_engine import plain_top2

        if self.reference is None:
            self.reference = round_["cells"][Cell(PLAIN, self.first).key]["outputs"]
        for key, measured in round_["cells"].items():
            cell = Cell.from_key(key)
            self.outputs.setdefault(cell, []).append(measured["outputs"])
            if cell == cell.anchor(self.first) and cell.in_flight > 1:
                self.batched.setdefault(cell.in_flight, measured["outputs"])
        differing = {
            pid
            for rounds in self.outputs.values()
            for outputs in rounds
            for pid, tokens in outputs.items()
            if tokens != self.reference[pid] and pid not in self.top2
        }
        if differing:
            prompts = [p for p in self.served.prompts if p.id in differing]
            self.top2 |= plain_top2(
                self.config,
                self.served.llamacpp,
                self.served.target,
                (),
                prompts,
                self.out_dir,
                self.config.tune.max_new_tokens,
            )

    def result(self, cell: Cell) -> dict:
        """Eval's check of each round the cell was measured in, summed (an output equal to plain
        decoding's at the cell's load counts as plain's)."""
        from eyas.eval.llamacpp_engine import lossless_rounds

        same_load = self.batched.get(cell.in_flight, {})
        rounds = [
            {pid: self.reference[pid] if tokens == same_load.get(pid) else tokens for pid, tokens in outputs.items()}
            for outputs in self.outputs.get(cell, [])
        ]
        limit = self.config.eval.llamacpp_tie_margin
        return lossless_rounds(self.served.prompts, rounds, self.reference, self.top2, limit)

    def passes(self, cell: Cell) -> bool:
        return not self.result(cell)["mismatched"]

    def batched_departures(self) -> dict[str, list[str]]:
        """Load -> the prompts on which plain decoding at that load departed from single-stream
        plain decoding beyond a float tie (loads where it never did are left out)."""
        from eyas.eval.llamacpp_engine import lossless_rounds

        limit = self.config.eval.llamacpp_tie_margin
        departures = {}
        for load, outputs in sorted(self.batched.items()):
            check = lossless_rounds(self.served.prompts, [outputs], self.reference, self.top2, limit)
            if check["mismatched"]:
                departures[str(load)] = check["mismatched"]
        return departures
