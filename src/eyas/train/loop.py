"""The training loop: build everything, resume, step, evaluate, checkpoint, finish.

Each optimizer step reads one global batch (``train.batch_size`` samples split across
ranks), unrolls the TTT steps, and divides every step's loss by its *global* count of
scored positions, so N ranks compute the gradient one process would. AdamW with linear
warmup then cosine decay to zero, gradient clipping, bf16 autocast on GPU and plain fp32
on CPU.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import dataclass

import torch

from eyas.config import ConfigError, RunConfig
from eyas.console import progress
from eyas.drafter.model import Eagle3Drafter
from eyas.drafter.spec import spec_for_target
from eyas.drafter.vocab import build_vocab, count_answer_tokens, draft_vocab_size, load_vocab, save_vocab
from eyas.paths import RunPaths
from eyas.target import load_model
from eyas.target.capture import check_aux_layers, default_aux_layers, num_decoder_layers
from eyas.target.heads import TargetParts, from_files, from_model
from eyas.train import checkpoint
from eyas.train.data import OfflineSource, OnlineSource, Schedule, check_sizes, read_split
from eyas.train.distributed import World
from eyas.train.evaluate import TargetHead, batch_stats, evaluate, summarize, totals
from eyas.train.metrics import MetricsLog

log = logging.getLogger(__name__)


@dataclass
class WarmupCosine:
    """LR multiplier: linear warmup over ``warmup`` steps, then cosine to zero at ``total``."""

    total: int
    warmup: int

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress_ = (step - self.warmup) / max(1, self.total - self.warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress_)))


RESUMABLE_CHANGES = {
    "epochs", "max_steps", "checkpoint_every", "eval_every", "eval_with_target", "parallel", "cache_states",
}
"""``train.*`` keys a run may change between resumes: its length, its reporting, how it is parallelised or fed."""


def fingerprint(config: RunConfig, aux_layers: list[int]) -> dict:
    """What a checkpoint must have been trained with to be continued under ``config``."""
    keys = {f"train.{k}": v for k, v in config.train.model_dump(mode="json").items() if k not in RESUMABLE_CHANGES}
    return {**keys, "target.model": config.target.model, "aux_layers": list(aux_layers)}


def prepare_vocab(config: RunConfig, paths: RunPaths, vocab_size: int, world: World) -> tuple[torch.Tensor, torch.Tensor]:
    """The run's draft vocabulary: reused when saved, else counted from the train split."""
    from eyas.merge.reader import iter_split

    size = draft_vocab_size(config.train.draft_vocab_size, vocab_size)
    path = paths.train_vocab
    if path.is_file():
        d2t, t2d = load_vocab(path)
        if d2t.shape[0] != size or t2d.shape[0] != vocab_size:
            raise ConfigError(
                f"train.draft_vocab_size: {path} holds {d2t.shape[0]} of {t2d.shape[0]} ids but the config asks for "
                f"{size} of {vocab_size}; delete {paths.train_dir} to start over"
            )
        return d2t, t2d
    d2t, t2d = build_vocab(count_answer_tokens(iter_split(paths, "train", ["input_ids", "loss_mask"]), vocab_size), size)
    if world.is_main:
        save_vocab(path, d2t, t2d)
    return d2t, t2d


def load_target(config: RunConfig, world: World) -> tuple[object | None, TargetParts]:
    """The target model when this process runs it (online, or for evaluation), and its head parts."""
    if config.extract.mode != "offline" or config.train.eval_with_target:
        model = load_model(config.target, world.device)
        return model, from_model(model)
    return None, from_files(config.target, world.device)


def build_source(config: RunConfig, paths: RunPaths, model, world: World):
    """Training samples with their hidden states (online or from shards) and the aux layers."""
    cfg = config.train
    if config.extract.mode == "offline":
        source = OfflineSource(paths, cfg.max_seq_len, world.device)
        aux_layers = source.aux_layers
    else:
        num_layers = num_decoder_layers(model)
        aux_layers = config.extract.aux_layers or default_aux_layers(num_layers)
        try:
            check_aux_layers(aux_layers, num_layers)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        samples = read_split(paths, "train", cfg.max_seq_len)
        source = OnlineSource(samples, model, aux_layers, world.device, cache=cfg.cache_states)
    check_sizes(len(source), cfg.batch_size, world.size, str(paths.merge_dir))
    return source, aux_layers


def autocast_for(device: torch.device):
    if device.type == "cuda":
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


def parallelize(drafter: Eagle3Drafter, parallel: str, world: World):
    """The module training calls: the drafter itself, its DDP wrapper, or the drafter sharded
    in place by FSDP2 (parameters become DTensors, so this runs before the optimizer exists)."""
    if not world.distributed:
        return drafter
    if parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(drafter)
        return drafter
    device_ids = [world.device.index] if world.device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(drafter, device_ids=device_ids, broadcast_buffers=False)


def train(config: RunConfig, world: World, quiet: bool = False, stop_after: int | None = None) -> dict:
    cfg, paths = config.train, RunPaths.of(config)
    model, parts = load_target(config, world)
    source, aux_layers = build_source(config, paths, model, world)
    eval_samples = read_split(paths, "eval", cfg.max_seq_len) if model is not None else []
    eval_source = OnlineSource(eval_samples, model, aux_layers, world.device) if eval_samples else None
    if eval_source is None:
        why = "the eval split is empty" if model is not None else "offline mode without train.eval_with_target"
        log.warning("no held-out evaluation during training: %s", why)
    d2t, t2d = prepare_vocab(config, paths, parts.config.vocab_size, world)
    spec = spec_for_target(parts.config, cfg, aux_layers, d2t.shape[0])

    torch.manual_seed(cfg.seed)
    drafter = Eagle3Drafter(spec, parts.embedding).to(world.device)
    drafter.set_vocab(d2t, t2d)
    drafter.train()
    forward = parallelize(drafter, cfg.parallel, world)
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    schedule = Schedule(source.lengths(), cfg.batch_size, cfg.seed)
    total = math.ceil(cfg.epochs * schedule.steps_per_epoch)
    total = min(total, cfg.max_steps) if cfg.max_steps else total
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(total, round(cfg.warmup_ratio * total)))

    step = 0
    resume_from = checkpoint.latest(paths.train_dir)
    if resume_from is not None:
        step = checkpoint.restore(resume_from, drafter, optimizer, scheduler, fingerprint(config, aux_layers))
        log.info("resuming from %s (step %d of %d)", resume_from, step, total)
    metrics = MetricsLog(paths.train_metrics, world.is_main)
    metrics.truncate_after(step)

    head = TargetHead(parts.lm_head, torch.arange(d2t.shape[0], device=world.device) + d2t.to(world.device), t2d.to(world.device))
    autocast = autocast_for(world.device)
    weights = torch.tensor([cfg.step_weight**k for k in range(cfg.ttt_steps)], dtype=torch.float64)
    last_eval: dict | None = None

    def run_eval(at: int) -> None:
        nonlocal last_eval
        if eval_source is None:
            return
        last_eval = {"split": "eval", "step": at, **evaluate(drafter, eval_source, head, cfg.ttt_steps, cfg.batch_size, world, autocast)}
        metrics.write(last_eval)
        accs = " ".join(f"{a:.3f}" for a in last_eval["acc"])
        log.info("eval step %d: acc per step %s, simulated acceptance length %.3f", at, accs, last_eval["acceptance_length"])

    def save_checkpoint(at: int) -> None:
        checkpoint.save(paths.train_dir, at, drafter, optimizer, scheduler, world.is_main, fingerprint(config, aux_layers))
        world.barrier()

    stop_at = total if stop_after is None else min(total, step + stop_after)
    with progress(quiet or not world.is_main, unit="tok") as bar:
        task = bar.add_task("train", total=total, completed=step, rate=0.0)
        while step < stop_at:
            started = time.perf_counter()
            batch = source.batch(schedule.rank_batch(step, world.rank, world.size))
            with autocast():
                stats = batch_stats(forward, drafter, batch, head, cfg.ttt_steps)
            sums = world.sum(totals(stats))
            loss = sum(
                w * s.loss_sum / sums[1, k].clamp(min=1) * world.size for k, (w, s) in enumerate(zip(weights.tolist(), stats))
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            optimizer.step()
            scheduler.step()
            step += 1
            summary = summarize(sums)
            tokens = int(world.sum(torch.tensor([batch.tokens], device=world.device)).item())
            elapsed = time.perf_counter() - started
            row = {
                "split": "train",
                "step": step,
                "epoch": step / schedule.steps_per_epoch,
                "loss": float((weights * sums[0].cpu() / sums[1].cpu().clamp(min=1)).sum()),
                "loss_steps": summary["loss"],
                "acc": summary["acc"],
                "acceptance_length": summary["acceptance_length"],
                "lr": scheduler.get_last_lr()[0],
                "grad_norm": float(grad_norm),
                "tokens": tokens,
                "tokens_per_s": tokens / elapsed,
            }
            metrics.write(row)
            bar.update(task, advance=1, rate=row["tokens_per_s"],
                       description=f"train loss {row['loss']:.3f} acc {' '.join(f'{a:.2f}' for a in row['acc'][:3])}")
            if step % cfg.checkpoint_every == 0 or step == stop_at:
                save_checkpoint(step)
            if step % cfg.eval_every == 0 and step < total:
                run_eval(step)
    if step < total:
        log.info("stopped at step %d of %d; rerun the same command to continue", step, total)
        return {"step": step, "total_steps": total, "final": None, "eval": None}
    run_eval(step)
    weights, _ = checkpoint.full_state(drafter, optimizer)
    out = checkpoint.write_drafter(weights, spec, paths.train_final) if world.is_main else paths.train_final
    world.barrier()
    log.info("drafter written to %s", out)
    return {"step": step, "total_steps": total, "final": str(out), "eval": last_eval}
