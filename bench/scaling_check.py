"""Does ``eyas scaling``'s line predict τ at a size it has not seen? One real check.

``eyas scaling CONFIG`` fits held-out τ against log₂(train samples) on nested subsets of a
run's train split and predicts τ beyond it. This bench grows the run's corpus ``--factor``
times the way a user would buy more data: it synthesizes new prompts from the target (never
one the run already holds, so none of its held-out prompts), answers them with the run's own
generation, tokenization and merge settings, adds them to the run's train split, trains the
run's recipe for the same passes per sample (:func:`eyas.scaling.plan.subset_steps`), and
measures held-out τ with the same evaluator on the same held-out prompts
(:func:`eyas.scaling.held_out_tau`). It prints the line's prediction at that size with the
line's standard error beside the measurement with its own.

Everything lives in ``<run_dir>/scaling/check-<factor>x/`` and resumes: prompts, answers and
the drafter are kept, so a rerun after an interruption redoes only what is missing.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python bench/scaling_check.py --run runs/demo/demo.yaml
[--factor 2]`` after ``eyas scaling runs/demo/demo.yaml``. On the demo (2×: 176 new prompts)
it took 19 minutes on 2 cores; run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from eyas import generate, merge, scaling, tokenize
from eyas.config import DatasetConfig, load_config
from eyas.jsonl import read_jsonl
from eyas.merge.reader import split_files, split_lengths
from eyas.paths import MARKER, RunPaths
from eyas.prompts.synth import synthesize
from eyas.records import tokenized_arrow_schema
from eyas.scaling.plan import Fit, subset_steps
from eyas.train.data import total_steps


def fitted_line(paths: RunPaths) -> Fit:
    report = paths.scaling_dir / "report.json"
    if not report.is_file():
        raise SystemExit(f"{report} is missing: run `eyas scaling CONFIG` first")
    fit = json.loads(report.read_text())["fit"]
    return Fit(fit["intercept"], fit["per_doubling"], fit["per_doubling_se"], fit["center"], fit["center_se"])


def new_prompts(config, work: Path, added: int) -> Path:
    """``added`` prompts synthesized from the target that none of the run's datasets holds."""
    known = work / "all-prompts.jsonl"
    originals = [row for d in config.datasets for _, row in read_jsonl(Path(d.source))]
    if not known.exists():
        known.write_text("".join(json.dumps(row) + "\n" for row in originals))
    synthesize(config, len(originals) + added, known)
    original_ids = {row["id"] for row in originals}
    fresh = [row for _, row in read_jsonl(known) if row["id"] not in original_ids]
    out = work / "new-prompts.jsonl"
    out.write_text("".join(json.dumps(row) + "\n" for row in fresh))
    return out


def answered(config, work: Path, prompts: Path) -> tuple[pa.Table, float]:
    """The new prompts answered, tokenized and merged by the run's own settings, all of them
    train rows; with the CPU seconds generation took (0 when resumed from a finished side run)."""
    side = config.model_copy(
        update={
            "run_dir": str(work / "side"),
            "datasets": [DatasetConfig(name=config.datasets[0].name, source=str(prompts.resolve()))],
            "merge": config.merge.model_copy(update={"eval_count": 0}),
        }
    )
    paths = RunPaths.of(side)
    started = time.process_time()
    if not (paths.merge_dir / MARKER).is_file():
        generate.run(side, quiet=True)
        tokenize.run(side, quiet=True)
        merge.run(side, quiet=True)
    return read_split(paths), time.process_time() - started


def read_split(paths: RunPaths) -> pa.Table:
    return pa.concat_tables([pq.read_table(f).cast(tokenized_arrow_schema()) for f in split_files(paths, "train")])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True, help="config of a run `eyas scaling` has measured")
    parser.add_argument("--factor", type=int, default=2, help="train on this many times the run's train prompts")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    config = load_config(Path(args.run))
    paths = RunPaths.of(config)
    fit = fitted_line(paths)
    work = paths.scaling_dir / f"check-{args.factor}x"
    work.mkdir(parents=True, exist_ok=True)

    samples = len(split_lengths(paths, "train"))
    prompts = new_prompts(config, work, (args.factor - 1) * samples)
    added, generation_cpu = answered(config, work, prompts)
    table = pa.concat_tables([read_split(paths), added])
    steps = subset_steps(total_steps(config.train, samples), samples, table.num_rows)
    grown = work / "run"
    fresh = not (grown / "merge" / MARKER).is_file()
    # The added samples have no extracted states: the grown corpus trains online whatever the run did.
    online = config.model_copy(update={"extract": config.extract.model_copy(update={"mode": "online"})})
    grown_config = scaling.corpus_run(online, table if fresh else None, grown, steps, table.num_rows / samples)
    timings = scaling.train_subset(grown_config, quiet=False)
    point, measured = scaling.held_out_tau(grown_config, RunPaths.of(grown_config).train_final)

    predicted, predicted_se = fit.tau(point.samples), fit.tau_se(point.samples)
    gap = (measured["tau"] - predicted) / math.hypot(predicted_se, measured["tau_se"])
    print(
        f"\nrun: {paths.root}; line from {paths.scaling_dir / 'report.json'}: "
        f"τ = {fit.intercept:.3f} + {fit.slope:.3f} ± {fit.slope_se:.3f} per doubling · log₂(samples)\n"
        f"added {added.num_rows} samples from {prompts} (generation {generation_cpu:.0f} CPU s this run); "
        f"trained {steps} steps in {timings['train_seconds']:.0f} s, {timings['train_cpu_seconds']:.0f} CPU s\n"
    )
    print("| train samples | predicted τ | measured τ | measured − predicted |")
    print("|---|---|---|---|")
    print(
        f"| {point.samples} | {predicted:.3f} ± {predicted_se:.3f} | {measured['tau']:.3f} ± {measured['tau_se']:.3f} "
        f"| {measured['tau'] - predicted:+.3f} ({gap:+.1f} σ) |"
    )


if __name__ == "__main__":
    main()
