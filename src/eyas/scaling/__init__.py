"""``eyas scaling CONFIG``: will more data help, by how much, and what will it cost?

Trains the run's own recipe on nested subsets of its train split (``scaling.fractions`` of the
prompts, every answer to a prompt kept with it, :func:`eyas.scaling.plan.nested_subsets`),
each for its share of the full run's steps, so all of them together cost less than the full run
once. Each subset's drafter, and the run's own, are evaluated by eval's own decoder on the same
held-out prompts, each at its last step (a run that kept the step with the best τ picked it on
those very prompts: :func:`eyas.train.last_step_drafter`); τ is fitted against log₂(samples) (:func:`eyas.scaling.plan.fit_log2`).

Prints and writes (``<run_dir>/scaling/report.json``, ``tau.png``): the gain per doubling with
its standard error, the train samples each ``scaling.target_tau`` needs, and their price from
the run's own measured rates — generation (dollars from the ledger for an API run, seconds
from generate's marker otherwise), extraction and training (their markers, totalled over every
call that made the outputs: :func:`eyas.stage.spent`) — for the added
samples and for training again on all of them.

Each subset lives in ``scaling/<samples>-<digest>/`` (a merge directory holding its train rows
and the run's held-out split, its ``train/`` and ``eval/``; an offline run's subsets link the
run's ``hidden/`` and read their rows from its shards by id, extracting nothing again): an
interrupted run resumes where it stopped, as those stages do, and a changed subset gets a
directory of its own.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
from pathlib import Path

from eyas.config import RunConfig
from eyas.paths import MARKER, RunPaths
from eyas.records import content_hash
from eyas.scaling.plan import Point, fit_log2, nested_subsets, subset_steps
from eyas.stage import spent

log = logging.getLogger(__name__)


def run(config: RunConfig, quiet: bool = False) -> dict:
    """Train and evaluate every subset (resuming what is done), fit, price; the report."""
    from eyas import train
    from eyas.merge.reader import iter_split
    from eyas.scaling.report import finish
    from eyas.stage import StageError, check
    from eyas.train import CONTRACT as TRAIN
    from eyas.train.data import total_steps

    paths = RunPaths.of(config)
    if check(config, TRAIN, paths).status != "current":
        raise StageError(f"scaling: {paths.train_final} is not current; run `eyas train CONFIG` first")
    ids = [row["id"] for row in iter_split(paths, "train", ["id"])]
    full_steps = total_steps(config.train, len(ids))
    points, rows = [], []
    for fraction, subset in sorted(nested_subsets(ids, config.scaling.fractions, config.scaling.seed).items()):
        steps = subset_steps(full_steps, len(ids), len(subset))
        subset_config = _subset(config, paths, sorted(subset), steps, fraction)
        seconds = train_subset(subset_config, quiet)
        point, tau = held_out_tau(subset_config, RunPaths.of(subset_config).train_final)
        points.append(point)
        rows.append({"fraction": fraction, "samples": len(subset), "steps": steps, **tau, **seconds})
    full_dir = paths.scaling_dir / f"{len(ids)}-full"
    full_config = _linked(config, full_dir)
    point, tau = held_out_tau(full_config, train.last_step_drafter(config))
    points.append(point)
    full_train = _marker_run(paths.marker("train"))
    rows.append({"fraction": 1.0, "samples": len(ids), "steps": full_steps, **tau, **full_train})
    report = {"family": config.train.drafter, "points": rows, "full_steps": full_steps}
    return finish(config, report, fit_log2(points), paths, quiet)


def _subset(config: RunConfig, paths: RunPaths, ids: list[str], steps: int, fraction: float) -> RunConfig:
    """The run as it trains on the train rows ``ids`` (:func:`corpus_run`)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from eyas.merge.reader import split_files

    where = paths.scaling_dir / f"{len(ids)}-{content_hash(ids)[:12]}"
    if (where / "merge" / MARKER).is_file():
        return corpus_run(config, None, where, steps, fraction)
    table = pa.concat_tables([pq.read_table(f) for f in split_files(paths, "train")])
    return corpus_run(
        config, table.filter(pc.is_in(table.column("id"), value_set=pa.array(ids))), where, steps, fraction
    )


def corpus_run(config: RunConfig, table, where: Path, steps: int, share: float) -> RunConfig:
    """The run's recipe on the train rows ``table`` (None: already written): a directory
    ``where`` whose merge holds them and the run's own held-out split (and, offline, a link to
    the run's shards, which must hold every row of ``table``), trained for ``steps``,
    with evaluations and checkpoints ``share`` times as far apart as the run's, so as often
    relative to its length. τ is not measured during its training (``train.tau_prompts: 0``,
    its drafter is its last step): :func:`held_out_tau` measures it once at the end, so a
    subset pays no fixed cost of evaluations that would only pick its checkpoint on the very
    prompts it is measured on."""
    import pyarrow.parquet as pq

    from eyas.merge.reader import split_files
    from eyas.train.data import steps_per_epoch

    paths = RunPaths.of(config)
    merge = where / "merge"
    if table is not None:
        tmp = where / "merge.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        pq.write_table(table, tmp / "train-00000.parquet")
        for f in [*split_files(paths, "eval"), paths.merge_stats, paths.marker("merge")]:
            shutil.copy(f, tmp / f.name)
        shutil.rmtree(merge, ignore_errors=True)
        os.replace(tmp, merge)
    if config.extract.mode == "offline":
        _link(RunPaths.layout(where, config.family_subdir).hidden_dir, paths.hidden_dir)
    samples = pq.read_metadata(merge / "train-00000.parquet").num_rows
    cfg = config.train
    train = cfg.model_copy(
        update={
            "max_steps": steps,
            "epochs": steps / steps_per_epoch(samples, cfg.batch_size),
            "eval_every": max(1, round(cfg.eval_every * share)),
            "checkpoint_every": max(1, round(cfg.checkpoint_every * share)),
            "tau_prompts": 0,
        }
    )
    return config.model_copy(update={"run_dir": str(where), "train": train})


def _linked(config: RunConfig, where: Path) -> RunConfig:
    """A directory whose merge is the run's own, for evaluating the run's drafter beside the subsets."""
    where.mkdir(parents=True, exist_ok=True)
    _link(where / "merge", RunPaths.of(config).merge_dir)
    return config.model_copy(update={"run_dir": str(where)})


def _link(link: Path, target: Path) -> None:
    if not link.exists():
        os.symlink(target.resolve(), link)


def train_subset(config: RunConfig, quiet: bool) -> dict:
    """Train the subset unless its drafter is current; its marker's timings."""
    from eyas import train
    from eyas.stage import check

    paths = RunPaths.of(config)
    if check(config, train.CONTRACT, paths).status != "current":
        train.run(config, quiet=quiet, redo=True)
    return _marker_run(paths.marker("train"))


def _marker_run(marker: Path) -> dict:
    """What training cost, over every call that trained it (:func:`eyas.stage.spent`)."""
    seconds, cpu_seconds = spent(json.loads(marker.read_text()))
    return {"train_seconds": seconds, "train_cpu_seconds": cpu_seconds}


def held_out_tau(config: RunConfig, drafter: Path) -> tuple[Point, dict]:
    """Held-out τ of ``drafter`` by eval's own decoder (greedy, the run's eval settings, no
    control), with its standard error from the spread over the prompts."""
    from eyas import eval as evaluation
    from eyas.merge.reader import split_lengths

    settings = {"engine": "eyas", "broken_control": False, "draft": str(drafter), "temperature": 0.0}
    eval_config = config.model_copy(update={"eval": config.eval.model_copy(update=settings)})
    method = evaluation.run(eval_config, quiet=True)["methods"][config.train.drafter]
    per_prompt = list(method["tau_per_prompt"].values())
    se = statistics.stdev(per_prompt) / len(per_prompt) ** 0.5 if len(per_prompt) > 1 else 0.0
    samples = len(split_lengths(RunPaths.of(config), "train"))
    return Point(samples, method["tau"], se), {"tau": method["tau"], "tau_se": se, "prompts": len(per_prompt)}


def per_sample(config: RunConfig) -> dict:
    """What a sample costs this run, from its own markers: generating it (per sample generated,
    held-out ones included: wall and CPU seconds, and dollars from the ledger for an API run),
    extracting its states (offline runs) and training on it (per train sample, at the run's
    passes per sample). Each stage's seconds are its outputs' total over every call that made
    them (:func:`eyas.stage.spent`), not the last call's: a rerun that found nothing to do
    costs nothing and changes no price."""
    from eyas.merge.reader import split_lengths

    paths = RunPaths.of(config)
    trained = len(split_lengths(paths, "train"))
    counts = {"generate": trained + len(split_lengths(paths, "eval")), "extract": trained, "train": trained}
    costs = {}
    for stage, samples in counts.items():
        marker = paths.marker(stage)
        if marker.is_file() and samples:
            seconds, cpu_seconds = spent(json.loads(marker.read_text()))
            costs[stage] = {"seconds": seconds / samples, "cpu_seconds": cpu_seconds / samples}
    ledger = paths.generate_dir / "ledger.jsonl"
    if config.generate.backend == "openai" and ledger.is_file():
        from eyas.generate.http.budget import replay

        spending, _ = replay(ledger)
        costs.setdefault("generate", {})["usd"] = spending.spent / counts["generate"]
    return costs
