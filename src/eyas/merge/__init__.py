"""Stage 4 — merge: every tokenized dataset into one shuffled corpus with a held-out split.

Consumes ``<run_dir>/tokenize/<dataset>.parquet`` for every dataset without ``drop: true``.
Produces ``<run_dir>/merge/train-NNNNN.parquet`` and ``eval-NNNNN.parquet`` (the tokenize
columns, in a shuffled order fixed by ``merge.seed``) and ``stats.json`` (samples, tokens and
trainable tokens per dataset and split, drops by reason, length histograms).

Guarantees: no prompt id (``#turn`` suffix stripped) is in both splits; truncation keeps
``loss_mask`` aligned with ``input_ids``; samples with no trainable token are dropped and
counted; memory stays bounded by ``merge.bucket_mb`` whatever the corpus size; the output,
its stage marker inside, replaces the previous merge all at once, so an interrupted merge
leaves the previous one intact and a rerun redoes it identically.
"""

from __future__ import annotations

import logging

from eyas.config import RunConfig
from eyas.console import console
from eyas.stage import StageContract, flat

log = logging.getLogger(__name__)

LAYOUT_KEYS = {"shard_samples", "bucket_mb"}
"""How the corpus is cut into files and how much of it is held in memory while shuffling: the
order comes from per-sample keys (:func:`eyas.merge.plan.order_key`), so neither changes which
samples are where, and readers go by row, not by file."""


def fingerprint(config: RunConfig) -> dict:
    keys = flat("merge", config.merge.model_dump(mode="json", exclude=LAYOUT_KEYS))
    for d in config.datasets:
        keys |= flat(f"datasets[{d.name}]", d.model_dump(mode="json", include={"weight", "merge_token_budget", "drop"}))
    return keys


CONTRACT = StageContract("merge", lambda c: ["tokenize"], fingerprint, lambda c, p: [p.merge_stats])


def run(config: RunConfig, quiet: bool = False) -> dict:
    from eyas.merge.build import merge
    from eyas.merge.stats import dropped_text, histogram_table, summary_table
    from eyas.paths import RunPaths
    from eyas.stage import begin

    stats = merge(config, begin(config, CONTRACT, RunPaths.of(config)), quiet)
    if not quiet:
        console.print(summary_table(stats))
        console.print(histogram_table(stats["train"]["length_histogram"], "train lengths"))
    log.info(
        "merged %d train samples (%d tokens) and %d eval samples; dropped %s",
        stats["train"]["samples"],
        stats["train"]["tokens"],
        stats["eval"]["samples"],
        dropped_text(stats["dropped"]),
    )
    return stats
