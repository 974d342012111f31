"""Stage 4 — merge: every tokenized dataset into one shuffled corpus with a held-out split.

Consumes ``<run_dir>/tokenize/<dataset>.parquet`` for every dataset without ``drop: true``.
Produces ``<run_dir>/merge/train-NNNNN.parquet`` and ``eval-NNNNN.parquet`` (the tokenize
columns, in a shuffled order fixed by ``merge.seed``) and ``stats.json`` (samples, tokens and
trainable tokens per dataset and split, drops by reason, length histograms).

Guarantees: no prompt id (``#turn`` suffix stripped) is in both splits; truncation keeps
``loss_mask`` aligned with ``input_ids``; samples with no trainable token are dropped and
counted; memory stays bounded by ``merge.bucket_mb`` whatever the corpus size; the output
appears all at once (``stats.json`` is the marker), so an interrupted merge leaves the
previous one intact and a rerun redoes it identically.
"""

from __future__ import annotations

import logging

from eyas.config import RunConfig
from eyas.console import console
from eyas.stage import StageContract

log = logging.getLogger(__name__)

CONTRACT = StageContract(
    "merge",
    lambda c, p: [p.merge_stats],
    lambda c: {
        "merge": c.merge.model_dump(mode="json"),
        "datasets": [
            d.model_dump(mode="json", include={"name", "weight", "merge_token_budget", "drop"}) for d in c.datasets
        ],
    },
)


def run(config: RunConfig, quiet: bool = False) -> dict:
    from eyas.merge.build import merge
    from eyas.merge.stats import dropped_text, histogram_table, summary_table

    stats = merge(config, quiet)
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
