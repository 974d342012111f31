"""Offline extraction: the target over every merged train sample, written shard by shard.

Each rank (``RANK``/``WORLD_SIZE`` from torchrun; one rank without it) writes every
``WORLD_SIZE``-th shard, skipping shards already finished by an earlier run under the same
marker. When all ranks are done, rank 0 checks every sidecar, writes ``index.json`` and the
stage marker, and swaps a redo in.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from eyas.config import ConfigError, RunConfig
from eyas.console import progress
from eyas.extract import CONTRACT, plan, storage
from eyas.files import recover_dir, replace_dir
from eyas.merge.reader import read_rows, split_lengths
from eyas.paths import RunPaths
from eyas.records import content_hash
from eyas.stage import StageError, StageRun, begin, check, differences, digest, read_marker
from eyas.target.capture import check_aux_layers, hf_hidden_state_indices
from eyas.target.engines import Prefill, open_prefill
from eyas.target.settings import PrefillCapture

log = logging.getLogger(__name__)


@dataclass
class Job:
    """Everything every rank derives identically from the config and the merged corpus."""

    aux_layers: list[int]
    hidden_size: int
    num_layers: int
    shard_tokens: int
    shards: list[range]
    lengths: list[int]
    made_with: dict
    """The stage's marker as it will be written, plus the shard layout: what a shard's sidecar
    must hold for the shard to belong to this run (marker-shaped, so a mismatch names keys)."""

    @property
    def fingerprint(self) -> str:
        return content_hash(self.made_with)


def plan_job(config: RunConfig, paths: RunPaths, started: StageRun) -> Job:
    from eyas.target import load_model_config, text_config

    lengths = split_lengths(paths, "train")
    if not lengths:
        raise StageError(f"{paths.merge_dir}: the train split is empty; nothing to extract")
    text = text_config(load_model_config(config.target))
    num_layers, hidden = text.num_hidden_layers, text.hidden_size
    x = config.extract
    aux_layers = started.marker["fingerprint"]["extract.aux_layers"]
    try:
        check_aux_layers(aux_layers, num_layers)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    shard_tokens = x.shard_tokens or plan.default_shard_tokens(hidden, len(aux_layers), x.dtype)
    made_with = dict(started.marker)
    made_with["fingerprint"] = {**made_with["fingerprint"], "extract.shard_tokens": shard_tokens}
    return Job(
        aux_layers, hidden, num_layers, shard_tokens, plan.plan_shards(lengths, shard_tokens), lengths, made_with
    )


def _prepare(paths: RunPaths, work: RunPaths, job: Job, expected: str, redo: bool) -> bool:
    """Make ``work.hidden_dir`` ready for this job (rank 0, before any rank writes); True when a
    finished redo only waits to be swapped in.

    Undoes a swap cut short, drops a ``hidden.redo`` that holds swapped-out old states, and
    refuses — or with ``redo`` discards — shards in progress that were made otherwise.
    """
    recover_dir(paths.hidden_dir)
    if work.hidden_dir != paths.hidden_dir:
        left = read_marker(work.marker("extract"))
        if left is not None and digest(left) == expected:
            return True
        if left is not None:
            shutil.rmtree(work.hidden_dir)
    other = _made_otherwise(work, job)
    if other is not None and not redo:
        path, made_with = other
        changes = "; ".join(differences(made_with, job.made_with)) if made_with else "made by an older eyas"
        raise StageError(
            f"{path}: hidden states in progress were made otherwise ({changes}); run `eyas extract CONFIG --redo` "
            f"to discard them and start over, or restore the settings to resume"
        )
    if other is not None:
        log.info("discarding hidden states in progress made otherwise (%s)", other[0].parent)
        shutil.rmtree(work.hidden_dir)
    work.hidden_dir.mkdir(parents=True, exist_ok=True)
    return False


def _discard_damaged(paths: RunPaths, files: list[str]) -> None:
    """Take out the shards whose bytes changed since they were written, with their sidecars, and
    the index and marker that vouched for them: the run then completes the set in place,
    writing those shards alone."""
    for name in files:
        log.warning("%s: its bytes are not those extract wrote; redoing this shard", name)
        Path(name).unlink()
        Path(name).with_suffix(".json").unlink(missing_ok=True)
    paths.marker("extract").unlink(missing_ok=True)
    paths.hidden_index.unlink(missing_ok=True)


def _require_room(config: RunConfig, work: RunPaths, job: Job, sidecars: list[dict | None]) -> None:
    """Refuse to start shards that will not fit: the shards still to write (those without a
    sidecar), at the bytes a token of them takes, against the free space (with the settings that
    store less, by the estimate)."""
    from eyas.extract.estimate import need
    from eyas.space import Need, free_bytes, require_room

    per_token = plan.bytes_per_token(job.hidden_size, len(job.aux_layers), config.extract.dtype)
    todo = [shard for shard, sidecar in enumerate(sidecars) if sidecar is None]
    tokens = sum(job.lengths[i] for s in todo for i in job.shards[s])
    if tokens * per_token <= free_bytes(work.hidden_dir):
        return
    _, fits = need(config)
    what = f"extract: {len(todo)} shards of {tokens:,} tokens in {config.extract.dtype}"
    require_room(work.hidden_dir, [Need(what, tokens * per_token)], fits)


def _kept_work(sidecars: list[dict | None]) -> tuple[float, float]:
    """Wall and CPU seconds the shards already done (by a killed or stopped run) cost, by their
    sidecars (one written before CPU time was recorded counts its wall time)."""
    done = [s for s in sidecars if s is not None]
    return sum(s["seconds"] for s in done), sum(s.get("cpu_seconds", s["seconds"]) for s in done)


def _made_otherwise(work: RunPaths, job: Job) -> tuple[Path, dict | None] | None:
    """The first sidecar (or index) in the work directory that belongs to another run, and what it was made with."""
    if not work.hidden_dir.is_dir():
        return None
    for sidecar in sorted(work.hidden_dir.glob("shard-*.json")):
        made = json.loads(sidecar.read_text())
        if made.get("fingerprint") != job.fingerprint:
            return sidecar, made.get("made_with")
    return None


def _rank() -> tuple[int, int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def _device(config: RunConfig, local_rank: int) -> torch.device:
    from eyas.target import pick_device

    device = pick_device(config.target)
    if device.type == "cuda" and device.index is None and config.target.device == "auto":
        return torch.device("cuda", local_rank)
    return device


def extract(config: RunConfig, quiet: bool = False, redo: bool = False) -> dict | None:
    """Write this rank's missing shards; rank 0 writes index.json once all exist (returned).

    States already on disk under the same marker are current and returned as they are. Others
    that are complete are replaced by a redo built in ``hidden.redo/`` and swapped in at the end.
    """
    paths = RunPaths.of(config)
    rank, world, local_rank = _rank()
    started = begin(config, CONTRACT, paths)
    state = check(config, CONTRACT, paths)
    if state.status == "current":
        log.info("hidden states are up to date (%s)", paths.hidden_dir)
        return json.loads(paths.hidden_index.read_text()) if rank == 0 else None
    if state.repairable and rank == 0:
        _discard_damaged(paths, state.damaged)
    # Missing states (none, shards lost or damaged) are completed in place; stale ones are redone aside.
    work = paths.rebuilding("hidden") if state.status == "stale" and not state.repairable else paths
    job = plan_job(config, paths, started)
    if world > 1 and not dist.is_initialized():
        # A rank may wait long for the slowest one: the barriers must not time out first.
        dist.init_process_group("gloo", timeout=timedelta(days=7))
    finished = _prepare(paths, work, job, digest(started.marker), redo) if rank == 0 else False
    if rank == 0 and not finished:
        sidecars = [storage.read_sidecar(work.hidden_dir, shard) for shard in range(len(job.shards))]
        started.carry(*_kept_work(sidecars))
        _require_room(config, work, job, sidecars)
    _barrier(world)
    if not finished:
        mine = plan.rank_shards(len(job.shards), rank, world)
        todo = [s for s in mine if storage.read_sidecar(work.hidden_dir, s) is None]
        if len(mine) > len(todo):
            log.info("rank %d: %d of its %d shards already done; resuming", rank, len(mine) - len(todo), len(mine))
        if todo:
            _write_shards(config, work, job, todo, rank, world, local_rank, quiet or rank != 0)
        _barrier(world)
    index = None
    if rank == 0:
        index = _write_index(work, job) if not finished else json.loads(work.hidden_index.read_text())
        if not finished:
            started.finish(work.marker("extract"))
        if work != paths:
            replace_dir(work.hidden_dir, paths.hidden_dir)
            log.info("the redone hidden states replace the old ones in %s", paths.hidden_dir)
    _barrier(world)
    if world > 1:
        dist.destroy_process_group()
    return index


def _barrier(world: int) -> None:
    if world > 1:
        dist.barrier()


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
    t0 = storage.clock()
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
                    f"hidden states under target.dtype {config.target.dtype!r}; set target.dtype to float32 or "
                    "bfloat16 and run `eyas extract CONFIG --redo` (the shards written so far are then discarded)"
                )
            buffer.put(i, rows[i]["input_ids"], rows[i]["loss_mask"], aux, final)
        advance(sum(lengths[i] for i in batch))
    info = {
        "sample_start": job.shards[shard].start,
        "fingerprint": job.fingerprint,
        "made_with": job.made_with,
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
    kept = ("file", "samples", "tokens", "bytes", "sha256", "mtime_ns", "sample_start")
    shards = [{k: s[k] for k in kept if k in s} for s in sidecars]
    seconds = sum(s["seconds"] for s in sidecars)
    tokens = sum(s["tokens"] for s in shards)
    h = job.hidden_size
    fingerprint = job.made_with["fingerprint"]
    index = {
        "format": storage.FORMAT,
        "target": fingerprint["target.model"],
        "target_dtype": fingerprint["target.dtype"],
        "aux_layers": job.aux_layers,
        "dtype": fingerprint["extract.dtype"],
        "shard_tokens": job.shard_tokens,
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
        | ({"aux_scale": ["tokens", len(job.aux_layers)]} if fingerprint["extract.dtype"] == "fp8" else {}),
        "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
        # Shards from either engine hold the same states (to float tolerance), so a run may switch.
        "engines": sorted({s.get("engine", "transformers") for s in sidecars}),
        "fingerprint": job.fingerprint,
        "shards": shards,
    }
    storage.write_json_atomic(storage.index_path(paths.hidden_dir), index)
    return index
