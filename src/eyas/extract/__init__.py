"""Stage 5 — extract: the target's auxiliary and final hidden states for every token.

Consumes the merged train split (``<run_dir>/merge/train-*.parquet``) and the target.
``extract.mode: offline`` produces ``<run_dir>/hidden/shard-NNNNN.safetensors`` (many
samples each, see :mod:`eyas.extract.storage`) and ``index.json`` (layers and their HF
``output_hidden_states`` indices, dtype, shapes, shards with checksums, measured tokens/s);
:class:`eyas.extract.reader.HiddenStates` reads them by sample. ``online`` writes nothing:
training calls :func:`eyas.target.capture.capture`, the same code, on the fly.

``extract.engine`` picks who runs the target (:func:`eyas.target.engines.open_prefill`):
``transformers``, one replica per torchrun rank, or ``vllm``, one vLLM engine that splits a
target too large for one device over several; both fill the same shards.

Guarantees: the captured layers are the outputs of 0-based decoder layers ``aux_layers``
(default ``[1, L//2-1, L-4]`` = HF ``hidden_states[2, L//2, L-3]``) and the final state is
after the final norm; no NaN/Inf is written; a killed run resumes without redoing finished
shards; under torchrun each rank writes its own shards and no file is written by two ranks.
A redo of finished states is built in ``hidden.redo/`` and swapped in whole, its marker inside,
so a crash at any moment leaves the old states with their marker or the new ones with theirs.
"""

from __future__ import annotations

import logging

from eyas.config import RunConfig
from eyas.stage import StageContract
from eyas.target import resolved_here

log = logging.getLogger(__name__)


def fingerprint(config: RunConfig) -> dict:
    """What the stored states depend on: which target, in which dtype, which of its layers, stored
    how (the samples and their length caps come with merge's marker).

    Not the engine, its parallelism or batching: they change how fast, not what is stored (the
    two engines agree to float tolerance). Not ``shard_tokens``: it cuts the same states into
    other files, and readers go by sample.
    """
    from eyas.target import aux_layers, served_identity

    x = config.extract
    return {
        **served_identity(config.target),
        "extract.aux_layers": aux_layers(config.target, x.aux_layers),
        "extract.dtype": x.dtype,
    }


def outputs(config: RunConfig, paths) -> list:
    """The index and every shard it lists: a shard deleted since makes the stage incomplete."""
    import json

    if not paths.hidden_index.is_file():
        return [paths.hidden_index]
    shards = json.loads(paths.hidden_index.read_text())["shards"]
    return [paths.hidden_index] + [paths.hidden_dir / s["file"] for s in shards]


def damaged(config: RunConfig, paths) -> list[str]:
    """Shards whose bytes are not those extract recorded (:func:`eyas.extract.storage.damaged`)."""
    from eyas.extract import storage

    if not paths.hidden_index.is_file():
        return []
    return [str(paths.hidden_dir / name) for name in storage.damaged(paths.hidden_dir)]


CONTRACT = StageContract("extract", lambda c: ["merge"], fingerprint, outputs, damaged=damaged, resolved=resolved_here)


def run(config: RunConfig, quiet: bool = False, redo: bool = False) -> dict | None:
    """Extract hidden states (offline mode); returns the index on rank 0, None otherwise.

    ``redo``: states in progress that were made otherwise are discarded instead of refused.
    """
    if config.extract.mode == "online":
        log.info("extract.mode is online: nothing to write; training computes hidden states on the fly")
        return None
    from eyas.extract.runner import extract

    index = extract(config, quiet, redo)
    if index is not None:
        log.info(
            "hidden states: %d samples, %d tokens, %d shards, %.2f GB (%s) in %s",
            index["num_samples"],
            index["num_tokens"],
            len(index["shards"]),
            index["bytes"] / 1e9,
            index["dtype"],
            config.run_dir,
        )
    return index
