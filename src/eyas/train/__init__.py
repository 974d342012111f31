"""Stage 6 — train: the EAGLE-3 drafter, by training-time test, on the target's own outputs.

Consumes the merged corpus (``<run_dir>/merge/{train,eval}-*.parquet``) and either the target
itself (``extract.mode: online``: hidden states computed per batch, never stored) or its
extracted shards (``offline``: ``<run_dir>/hidden``).

Produces under ``<run_dir>/train/``: ``vocab.safetensors`` (the draft vocabulary, reused on
resume), ``checkpoints/step-N/`` (the two newest), ``metrics.jsonl`` (per step: loss,
per-step top-1 accuracy, simulated acceptance length, lr, tokens/s; per evaluation on the
eval split: the same), and ``final/`` — the trained drafter in the SGLang/vLLM layout,
loadable with :meth:`eyas.drafter.model.Eagle3Drafter.load`.

Guarantees: an interrupted run continues from its newest checkpoint exactly as if it had
never stopped (weights, optimizer, scheduler, RNG and data position); the same command
under ``torchrun`` trains data-parallel with the gradient of one process on the global batch.
"""

from __future__ import annotations

from eyas.config import RunConfig
from eyas.stage import StageContract


def _fingerprint(config: RunConfig) -> dict:
    """What a checkpoint must have been trained with to be continued (the resume check's own), and
    where the states come from."""
    from eyas.train.loop import fingerprint

    return {**fingerprint(config, config.extract.aux_layers or []), "extract.mode": config.extract.mode}


CONTRACT = StageContract(
    "train", lambda c, p: [p.train_final / "config.json", p.train_final / "model.safetensors"], _fingerprint
)


def run(config: RunConfig, quiet: bool = False, stop_after: int | None = None) -> dict:
    """Train (or resume) the drafter; returns ``{step, total_steps, final, eval}``.

    ``stop_after``: stop cleanly after this many optimizer steps in this invocation, with a
    checkpoint (for time-boxed jobs); the next run continues from there.
    """
    from eyas.train.distributed import setup, teardown
    from eyas.train.loop import train

    world = setup(config.target)
    try:
        return train(config, world, quiet, stop_after)
    finally:
        teardown(world)
