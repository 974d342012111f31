"""Offline extraction: the target over every merged train sample, written shard by shard.

Each rank (``RANK``/``WORLD_SIZE`` from torchrun; one rank without it) writes every
``WORLD_SIZE``-th shard, skipping shards already finished by an earlier run. When all ranks
are done, rank 0 checks every sidecar and writes ``index.json``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass
from datetime import timedelta

import torch

from eyas.config import ConfigError, RunConfig
from eyas.console import progress
from eyas.extract import fingerprint, plan, storage
from eyas.merge.reader import read_rows, split_lengths
from eyas.paths import RunPaths
from eyas.records import content_hash
from eyas.stage import StageError
from eyas.target.capture import check_aux_layers, default_aux_layers, hf_hidden_state_indices
from eyas.target.engines import Prefill, open_prefill
from eyas.target.settings import PrefillCapture

log = logging.getLogger(__name__)


@dataclass
class Job:
    """Everything every rank derives identically from the config and the merged corpus."""

    aux_layers: list[int]
    hidden_size: int
    num_layers: int
    shards: list[range]
    lengths: list[int]
    settings: dict
    fingerprint: str


def plan_job(config: RunConfig, paths: RunPaths) -> Job:
    from eyas.target import load_model_config, text_config

    lengths = split_lengths(paths, "train")
    if not lengths:
        raise StageError(f"{paths.merge_dir}: the train split is empty; nothing to extract")
    model_config = load_model_config(config.target)
    text = text_config(model_config)
    num_layers, hidden = text.num_hidden_layers, text.hidden_size
    x = config.extract
    aux_layers = list(x.aux_layers) if x.aux_layers is not None else default_aux_layers(num_layers)
    try:
        check_aux_layers(aux_layers, num_layers)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    shard_tokens = x.shard_tokens or plan.default_shard_tokens(hidden, len(aux_layers), x.dtype)
    settings = {
        **fingerprint(config),
        "aux_layers": aux_layers,
        "shard_tokens": shard_tokens,
        "merge_stats_sha256": hashlib.sha256(paths.merge_stats.read_bytes()).hexdigest(),
    }
    return Job(
        aux_layers,
        hidden,
        num_layers,
        plan.plan_shards(lengths, shard_tokens),
        lengths,
        settings,
        content_hash(settings),
    )


def _check_existing(paths: RunPaths, job: Job) -> None:
    """Refuse to mix shards made from another merge or with other settings into this set."""
    for shard in range(len(job.shards)):
        done = storage.read_sidecar(paths.hidden_dir, shard)
        if done is not None and done.get("fingerprint") != job.fingerprint:
            raise StageError(
                f"{storage.sidecar_path(paths.hidden_dir, shard)}: made from another merge or with other "
                f"extract settings (now {job.settings}); delete {paths.hidden_dir} or restore the settings"
            )


def _rank() -> tuple[int, int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def _device(config: RunConfig, local_rank: int) -> torch.device:
    from eyas.target import pick_device

    device = pick_device(config.target)
    if device.type == "cuda" and device.index is None and config.target.device == "auto":
        return torch.device("cuda", local_rank)
    return device


def extract(config: RunConfig, quiet: bool = False) -> dict | None:
    """Write this rank's missing shards; rank 0 writes index.json once all exist (returned)."""
    paths = RunPaths.of(config)
    rank, world, local_rank = _rank()
    job = plan_job(config, paths)
    paths.hidden_dir.mkdir(parents=True, exist_ok=True)
    _check_existing(paths, job)
    mine = plan.rank_shards(len(job.shards), rank, world)
    todo = [s for s in mine if storage.read_sidecar(paths.hidden_dir, s) is None]
    skipped = len(mine) - len(todo)
    if skipped:
        log.info("rank %d: %d of its %d shards already done; resuming", rank, skipped, len(mine))
    if todo:
        _write_shards(config, paths, job, todo, rank, world, local_rank, quiet or rank != 0)
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            # A rank may wait long for the slowest one: the barrier must not time out first.
            dist.init_process_group("gloo", timeout=timedelta(days=7))
        dist.barrier()
    index = _write_index(paths, job) if rank == 0 else None
    if world > 1:
        torch.distributed.destroy_process_group()
    return index


def _write_shards(
    config, paths, job: Job, todo: list[int], rank: int, world: int, local_rank: int, quiet: bool
) -> None:
    engine = config.extract.engine
    if engine == "vllm" and world > 1:
        raise ConfigError(
            "extract.engine: vllm runs once, not under torchrun: vLLM itself spreads the target over "
            "extract.tensor_parallel_size × pipeline_parallel_size GPUs"
        )
    max_len = max(job.lengths[i] for s in todo for i in job.shards[s])
    device = _device(config, local_rank)
    capture = PrefillCapture.from_config(config.extract)
    with open_prefill(
        config.target, capture, engine, job.aux_layers, job.num_layers, max_len, paths.hidden_dir, device
    ) as prefill:
        _write_with(
            config, paths, job, todo, prefill, f"extract (rank {rank}/{world})" if world > 1 else "extract", quiet
        )


def _write_with(config, paths, job: Job, todo: list[int], prefill: Prefill, label: str, quiet: bool) -> None:
    total = sum(job.lengths[i] for s in todo for i in job.shards[s])
    started, done_tokens, written = time.monotonic(), 0, 0
    with progress(quiet) as bar:
        task = bar.add_task(label, total=total, rate=0.0)

        def advance(n: int) -> None:
            nonlocal done_tokens
            done_tokens += n
            bar.update(task, completed=done_tokens, rate=done_tokens / max(time.monotonic() - started, 1e-9))

        for shard in todo:
            storage.remove_partial(paths.hidden_dir, shard)
            sidecar = _extract_shard(config, paths, job, prefill, shard, advance)
            written += sidecar["bytes"]
            amount = f"{written / 1e9:,.2f} GB" if written >= 1e9 else f"{written / 1e6:,.1f} MB"
            bar.update(task, description=f"{label} · {amount} written")
            log.info(
                "shard %d: %d samples, %d tokens, %.1f MB in %.1f s",
                shard,
                sidecar["samples"],
                sidecar["tokens"],
                sidecar["bytes"] / 1e6,
                sidecar["seconds"],
            )


def _extract_shard(config, paths, job: Job, prefill: Prefill, shard: int, advance) -> dict:
    t0 = time.monotonic()
    rows = read_rows(paths, "train", job.shards[shard].start, job.shards[shard].stop, ["id", "input_ids", "loss_mask"])
    lengths = [len(r["input_ids"]) for r in rows]
    buffer = storage.ShardBuffer(
        [r["id"] for r in rows], lengths, job.hidden_size, len(job.aux_layers), config.extract.dtype
    )
    for batch in plan.plan_batches(lengths, config.extract.batch_tokens):
        outputs = prefill.capture([rows[i]["input_ids"] for i in batch])
        for i, (aux, final) in zip(batch, outputs, strict=True):
            if not (torch.isfinite(aux).all() and torch.isfinite(final).all()):
                raise StageError(
                    f"{paths.hidden_dir}: sample {rows[i]['id']} (train row {job.shards[shard].start + i}) has NaN/Inf "
                    f"hidden states under target.dtype {config.target.dtype!r}; try float32 or bfloat16"
                )
            buffer.put(i, rows[i]["input_ids"], rows[i]["loss_mask"], aux, final)
        advance(sum(lengths[i] for i in batch))
    info = {
        "sample_start": job.shards[shard].start,
        "fingerprint": job.fingerprint,
        "rank": _rank()[0],
        "engine": config.extract.engine,
    }
    return storage.write_shard(paths.hidden_dir, shard, buffer, info, t0)


def _write_index(paths: RunPaths, job: Job) -> dict:
    sidecars = [storage.read_sidecar(paths.hidden_dir, shard) for shard in range(len(job.shards))]
    for shard, sidecar in enumerate(sidecars):
        if sidecar is None:
            raise StageError(
                f"{storage.shard_path(paths.hidden_dir, shard)}: missing after every rank finished; rerun extract"
            )
    shards = [{k: s[k] for k in ("file", "samples", "tokens", "bytes", "sha256", "sample_start")} for s in sidecars]
    seconds = sum(s["seconds"] for s in sidecars)
    tokens = sum(s["tokens"] for s in shards)
    h = job.hidden_size
    index = {
        "format": storage.FORMAT,
        **job.settings,
        "hf_hidden_state_indices": hf_hidden_state_indices(job.aux_layers),
        "layer_convention": "aux_layers are 0-based decoder layers whose outputs are stored (= HF hidden_states[i + 1])",
        "final": "base model output after the final norm (lm_head input)",
        "num_layers": job.num_layers,
        "hidden_size": h,
        "num_samples": len(job.lengths),
        "num_tokens": tokens,
        "bytes": sum(s["bytes"] for s in shards),
        "tensors": {
            "aux": ["tokens", len(job.aux_layers) * h],
            "final": ["tokens", h],
            "input_ids": ["tokens"],
            "loss_mask": ["tokens"],
            "offsets": ["samples + 1"],
        }
        | ({"aux_scale": ["tokens", len(job.aux_layers)]} if job.settings["dtype"] == "fp8" else {}),
        "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
        # Shards from either engine hold the same states (to float tolerance), so a run may switch.
        "engines": sorted({s.get("engine", "transformers") for s in sidecars}),
        "fingerprint": job.fingerprint,
        "shards": shards,
    }
    storage.write_json_atomic(storage.index_path(paths.hidden_dir), index)
    return index
