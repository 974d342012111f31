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
"""

from __future__ import annotations

import logging

from eyas.config import RunConfig
from eyas.stage import StageContract

log = logging.getLogger(__name__)


def fingerprint(config: RunConfig) -> dict:
    """What the stored states depend on: the target and which of its states, stored how.

    Not the engine, its parallelism or batching: they change how fast, not what is stored.
    The runner fills in the defaults (``aux_layers``, ``shard_tokens``) from the target.
    """
    x = config.extract
    return {"target": config.target.model, "aux_layers": x.aux_layers, "dtype": x.dtype, "shard_tokens": x.shard_tokens}


CONTRACT = StageContract("extract", lambda c, p: [p.hidden_index], fingerprint)


def run(config: RunConfig, quiet: bool = False) -> dict | None:
    """Extract hidden states (offline mode); returns the index on rank 0, None otherwise."""
    if config.extract.mode == "online":
        log.info("extract.mode is online: nothing to write; training computes hidden states on the fly")
        return None
    from eyas.extract.runner import extract

    index = extract(config, quiet)
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
