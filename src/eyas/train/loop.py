"""The training loop: build everything, resume, step, evaluate, checkpoint, finish.

Each optimizer step reads one global batch (``train.batch_size`` samples split across
ranks), unrolls the TTT steps, and divides every step's loss by its *global* count of
scored positions, so N ranks compute the gradient one process would. AdamW (or Muon, see
:mod:`eyas.train.optimizer`) with linear warmup then cosine decay to zero, gradient clipping,
bf16 autocast on GPU and plain fp32 on CPU.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from eyas.config import ConfigError, RunConfig, TrainConfig
from eyas.console import progress
from eyas.drafter.families import family, new_drafter
from eyas.drafter.family import Objective, TrainingInputs
from eyas.drafter.spec import spec_for_target
from eyas.drafter.vocab import build_vocab, count_answer_tokens, draft_vocab_size, load_vocab, save_vocab
from eyas.files import recover_dir, replace_dir
from eyas.paths import MARKER, RunPaths
from eyas.stage import StageError, StageRun, StageState, begin, check, differences, digest, read_marker
from eyas.target import load_model, load_tokenizer, stop_token_ids
from eyas.target.capture import check_aux_layers, num_decoder_layers
from eyas.target.heads import TargetParts, from_files, from_model
from eyas.train import CONTINUED_KEY, CONTRACT, LENGTH_KEYS, checkpoint, runs_target
from eyas.train.data import OfflineSource, OnlineSource, Schedule, check_sizes, read_split, total_steps
from eyas.train.distributed import World
from eyas.train.evaluate import evaluate, summarize, totals
from eyas.train.metrics import MetricsLog
from eyas.train.optimizer import Optimizers, build_optimizers
from eyas.train.plot import plot_training
from eyas.train.selection import Kept, select
from eyas.train.tau import BEST_FILE, HeldOutDecoding, forget_later_than, unsharded_copy
from eyas.train.warm_start import warm_start

log = logging.getLogger(__name__)


def resume_key(started: StageRun) -> dict:
    """What a checkpoint must have been made with to be continued: the stage's marker as it will
    be written (the data's digests, every hyperparameter) but for the run's length, which a
    longer run raises. Marker-shaped, so a mismatch is named key by key."""
    key = {k: v for k, v in started.marker.items() if k != "run"}
    key["fingerprint"] = {k: v for k, v in key["fingerprint"].items() if k not in LENGTH_KEYS}
    return key


def prepare_vocab(
    config: RunConfig, paths: RunPaths, vocab_size: int, world: World
) -> tuple[torch.Tensor, torch.Tensor]:
    """The run's draft vocabulary: reused when saved, else counted from the train split."""
    from eyas.merge.reader import iter_split

    size = draft_vocab_size(config.train.draft_vocab_size, vocab_size)
    path = paths.train_vocab
    if path.is_file():
        d2t, t2d = load_vocab(path)
        if d2t.shape[0] != size or t2d.shape[0] != vocab_size:
            raise StageError(
                f"train.draft_vocab_size: {path} holds {d2t.shape[0]} of {t2d.shape[0]} ids but the config asks for "
                f"{size} of {vocab_size}; delete {paths.train_dir} to start over"
            )
        return d2t, t2d
    d2t, t2d = build_vocab(
        count_answer_tokens(iter_split(paths, "train", ["input_ids", "loss_mask"]), vocab_size), size
    )
    if world.is_main:
        save_vocab(path, d2t, t2d)
    return d2t, t2d


def load_target(config: RunConfig, world: World) -> tuple[object | None, TargetParts]:
    """The target model when this process runs it (online, or for evaluation), and its head parts."""
    if runs_target(config):
        model = load_model(config.target, world.device)
        return model, from_model(model)
    return None, from_files(config.target, world.device)


def build_source(config: RunConfig, paths: RunPaths, model, lm_head: torch.Tensor, world: World, started: StageRun):
    """Training samples with their hidden states (online or from shards), the share
    ``train.keep`` keeps of them, and the aux layers."""
    cfg = config.train
    if config.extract.mode == "offline":
        source = OfflineSource(paths, cfg.max_seq_len, world.device)
        aux_layers = source.aux_layers
    else:
        num_layers = num_decoder_layers(model)
        aux_layers = started.marker["fingerprint"]["extract.aux_layers"]
        try:
            check_aux_layers(aux_layers, num_layers, count=family(cfg.drafter).aux_layer_count)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        samples = read_split(paths, "train", cfg.max_seq_len)
        source = OnlineSource(samples, model, aux_layers, world.device, cache=cfg.cache_states)
    source = select(cfg, source, lm_head, world)
    check_sizes(len(source), cfg.batch_size, world.size, str(paths.merge_dir))
    return source, aux_layers


def build_eval_source(
    config: RunConfig, paths: RunPaths, model, aux_layers: list[int], world: World
) -> OnlineSource | None:
    """The held-out split run through the target, or None (with a warning) when there is none to score."""
    eval_samples = read_split(paths, "eval", config.train.max_seq_len) if model is not None else []
    if eval_samples:
        return OnlineSource(eval_samples, model, aux_layers, world.device)
    why = "the eval split is empty" if model is not None else "offline mode without train.eval_with_target"
    log.warning("no held-out evaluation during training: %s", why)
    return None


def build_held_out_decoding(config: RunConfig, paths: RunPaths, model) -> HeldOutDecoding | None:
    """The prompts τ is measured on during training, or None (with the reason when it was asked for)."""
    from eyas.merge.reader import held_out_prompts

    cfg = config.train
    if cfg.tau_prompts == 0:
        return None
    prompts = [ids for _, _, ids in held_out_prompts(paths, cfg.tau_prompts)] if model is not None else []
    if not prompts:
        why = "the eval split has no prompts" if model is not None else "offline mode without train.eval_with_target"
        log.warning("no τ measured during training (%s): train/final is the last step", why)
        return None
    stop = stop_token_ids(load_tokenizer(config.target))
    return HeldOutDecoding(model, prompts, cfg.tau_draft_tokens, cfg.tau_new_tokens, stop)


def autocast_for(device: torch.device):
    if device.type == "cuda":
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


def parallelize(drafter: torch.nn.Module, parallel: str, world: World):
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


@dataclass
class Trainer:
    """What the step, evaluation, checkpoints and the final write share; ``step`` counts the optimizer steps done."""

    cfg: TrainConfig
    world: World
    paths: RunPaths
    drafter: torch.nn.Module
    """A drafter of the run's family (:mod:`eyas.drafter.families`)."""
    forward: torch.nn.Module
    """What the step calls: the drafter, or its DDP wrapper (see :func:`parallelize`)."""
    params: list[torch.nn.Parameter]
    optimizers: Optimizers
    source: OnlineSource | OfflineSource | Kept
    eval_source: OnlineSource | None
    held_out: HeldOutDecoding | None
    """What τ is measured on during training (None: not measured; final is the last step)."""
    schedule: Schedule
    objective: Objective
    total: int
    made_with: dict
    """:func:`resume_key`: what this run's checkpoints are made with."""
    stage: StageRun
    """The stage run this training is (its clock, carried on from a checkpoint it resumes)."""
    schedules: list[list[int]]
    """``[first step, total]`` of each learning-rate schedule the run has followed: one for a run
    trained to its length in one go, one more from the step a longer run continued at
    (:data:`eyas.train.CONTINUED_KEY`)."""
    step_weights: torch.Tensor
    """[objective.positions] float64: the weight of each position's loss (the family's
    :attr:`~eyas.drafter.family.Training.step_weights`)."""
    autocast: Callable
    metrics: MetricsLog = field(init=False)
    """Opened by :func:`resume`."""
    step: int = 0
    last_eval: dict | None = None
    best: dict | None = None
    """Rank 0: step and τ of the drafter in ``train/best/``."""


def build(config: RunConfig, world: World, paths: RunPaths, started: StageRun) -> Trainer:
    """Target parts, data, drafter, optimizer and LR schedule, writing under ``paths`` (the run's
    own, or its redo place); the seed is set right before the drafter's weights are drawn, so
    they do not depend on what loading the rest consumed."""
    cfg = config.train
    model, parts = load_target(config, world)
    source, aux_layers = build_source(config, paths, model, parts.lm_head, world, started)
    eval_source = build_eval_source(config, paths, model, aux_layers, world)
    held_out = build_held_out_decoding(config, paths, model)
    base = spec_for_target(parts.config, cfg, aux_layers, parts.config.vocab_size)
    drafter_family = family(cfg.drafter)
    setup = drafter_family.training(
        TrainingInputs(
            config, base, parts.lm_head, lambda: prepare_vocab(config, paths, parts.config.vocab_size, world)
        )
    )

    torch.manual_seed(cfg.seed)
    drafter = new_drafter(setup.spec, parts.embedding, parts.lm_head).to(world.device)
    if setup.vocab is not None:
        drafter.set_vocab(*setup.vocab)
    if cfg.init_from:
        warm_start(drafter, Path(cfg.init_from), parts.config.num_hidden_layers)
    drafter.train()
    forward = parallelize(drafter, cfg.parallel, world)
    params = [p for p in drafter.parameters() if p.requires_grad]
    schedule = Schedule(source.lengths(), cfg.batch_size, cfg.seed)
    total = total_steps(cfg, schedule.num_samples)
    optimizers = build_optimizers(drafter, cfg, drafter_family.lr(cfg), total)
    return Trainer(
        cfg=cfg,
        world=world,
        paths=paths,
        drafter=drafter,
        forward=forward,
        params=params,
        optimizers=optimizers,
        source=source,
        eval_source=eval_source,
        held_out=held_out,
        schedule=schedule,
        objective=setup.objective,
        total=total,
        made_with=resume_key(started),
        stage=started,
        schedules=[[0, total]],
        step_weights=torch.tensor(setup.step_weights, dtype=torch.float64),
        autocast=autocast_for(world.device),
    )


def resume(trainer: Trainer) -> None:
    """Continue from the newest checkpoint, if any (a longer run than the checkpoint's goes on
    under its own schedule from there, another part of ``schedules``), and cut the metrics log
    back to its step so the file reads as one run. The log is opened only once the checkpoint is accepted, so a
    refused resume adds no TensorBoard files."""
    path = checkpoint.newest_intact(trainer.paths.train_dir)
    if path is not None:
        trainer.step, schedules, spent = checkpoint.restore(
            path, trainer.drafter, trainer.optimizers, trainer.made_with
        )
        trainer.stage.carry(*spent)
        log.info("resuming from %s (step %d of %d)", path, trainer.step, trainer.total)
        if schedules[-1][1] != trainer.total:
            schedules = [*schedules, [trainer.step, trainer.total]]
            log.info(
                "the run was %d steps long: from step %d the learning rate follows the %d-step schedule, and the "
                "drafter's marker says it was continued",
                schedules[-2][1],
                trainer.step,
                trainer.total,
            )
        trainer.schedules = schedules
    trainer.metrics = MetricsLog(trainer.paths.train_metrics, trainer.world.is_main, trainer.step)
    if trainer.world.is_main:
        trainer.best = forget_later_than(trainer.paths.train_best, trainer.step)


def train_step(trainer: Trainer) -> dict:
    """One optimizer step on this rank's share of global batch ``trainer.step``; advances the step
    and returns its metrics row. Each TTT step's loss is divided by its global count of scored
    positions and multiplied by the world size, which undoes the gradient averaging over ranks."""
    cfg, world = trainer.cfg, trainer.world
    started = time.perf_counter()
    indices = trainer.schedule.rank_batch(trainer.step, world.rank, world.size)
    batch = trainer.source.batch(indices)
    # Seeded by step and sample, not drawn from a stream: a resumed run, or N ranks, draw what one would.
    seeds = [hash((cfg.seed, trainer.step, i)) & (2**63 - 1) for i in indices]
    with trainer.autocast():
        stats = trainer.objective.stats(trainer.forward, trainer.drafter, batch, seeds)
    sums = world.sum(totals(stats))
    weights = trainer.step_weights
    loss = sum(
        w * s.loss_sum / sums[1, k].clamp(min=1) * world.size for k, (w, s) in enumerate(zip(weights.tolist(), stats))
    )
    trainer.optimizers.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(trainer.params, cfg.grad_clip)
    grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
    trainer.optimizers.step()
    trainer.step += 1
    summary = summarize(sums)
    tokens = int(world.sum(torch.tensor([batch.tokens], device=world.device)).item())
    elapsed = time.perf_counter() - started
    return {
        "split": "train",
        "step": trainer.step,
        "epoch": trainer.step / trainer.schedule.steps_per_epoch,
        "loss": float((weights * sums[0].cpu() / sums[1].cpu().clamp(min=1)).sum()),
        "loss_steps": summary["loss"],
        "acc": summary["acc"],
        "acceptance_length": summary["acceptance_length"],
        "lr": trainer.optimizers.lr,
        "grad_norm": float(grad_norm),
        "tokens": tokens,
        "tokens_per_s": tokens / elapsed,
    }


def run_eval(trainer: Trainer) -> None:
    """Score the eval split at the current step, when there is one (kept as
    ``trainer.last_eval``), and measure τ on held-out prompts."""
    score_eval_split(trainer)
    measure_tau(trainer)


def score_eval_split(trainer: Trainer) -> None:
    if trainer.eval_source is None:
        return
    cfg = trainer.cfg
    scores = evaluate(
        trainer.drafter,
        trainer.eval_source,
        trainer.objective,
        cfg.batch_size,
        trainer.world,
        trainer.autocast,
    )
    trainer.last_eval = {"split": "eval", "step": trainer.step, **scores}
    trainer.metrics.write(trainer.last_eval)
    accs = " ".join(f"{a:.3f}" for a in scores["acc"])
    length = scores["acceptance_length"]
    log.info("eval step %d: acc per step %s, simulated acceptance length %.3f", trainer.step, accs, length)


def measure_tau(trainer: Trainer) -> None:
    """τ of the drafter as it stands, into the metrics; kept in ``train/best/`` when no earlier
    step measured higher. Every rank gathers the weights; rank 0 decodes and writes."""
    if trainer.held_out is None:
        return
    weights = checkpoint.full_weights(trainer.drafter)
    if trainer.world.is_main:
        scores = trainer.held_out.measure(unsharded_copy(trainer.drafter, weights, trainer.held_out.model))
        trainer.metrics.write({"split": "tau", "step": trainer.step, **scores})
        per_position = " ".join(f"{a:.3f}" for a in scores["per_position"])
        log.info(
            "step %d: τ %.3f on %d held-out prompts (accepted per position %s)",
            trainer.step,
            scores["tau"],
            scores["prompts"],
            per_position,
        )
        if trainer.best is None or scores["tau"] > trainer.best["tau"]:
            best = {"step": trainer.step, "tau": scores["tau"]}
            checkpoint.write_drafter(
                weights,
                trainer.drafter.spec,
                trainer.paths.train_best,
                lambda d: (d / BEST_FILE).write_text(json.dumps(best)),
            )
            trainer.best = best
    trainer.world.barrier()


def require_checkpoint_room(trainer: Trainer) -> None:
    """Refuse a run whose files will not fit: each checkpoint holds the trained weights and
    AdamW's two moments (fp32), :data:`~eyas.train.checkpoint.KEEP` of them stay and one more is
    written before the oldest goes, and ``best/`` and ``final/`` hold the weights once each;
    less what the training directory already holds."""
    from eyas.space import Need, require_room, tree_bytes

    weights = sum(p.numel() * 4 for p in trainer.params)
    total = weights * (3 * (checkpoint.KEEP + 1) + 2)
    held = tree_bytes(trainer.paths.train_dir)
    what = f"train: checkpoints, the best and final drafters ({weights / 4:,.0f} trained weights)"
    require_room(
        trainer.paths.train_dir,
        [Need(what, max(0, total - held))],
        ["a smaller drafter (train.intermediate_size, train.draft_vocab_size)"],
    )


def save_checkpoint(trainer: Trainer) -> None:
    """Every rank takes part (FSDP gathers collectively) and waits until rank 0 has written it."""
    checkpoint.save(
        trainer.paths.train_dir,
        trainer.step,
        trainer.drafter,
        trainer.optimizers,
        trainer.world.is_main,
        trainer.made_with,
        trainer.schedules,
        trainer.stage.spent_now(),
    )
    trainer.world.barrier()


def finish(trainer: Trainer, started: StageRun, resumed_at: int) -> dict:
    """The last evaluation, then the drafter alone in the servable layout with the stage's
    marker inside (one rename puts both in place): gathered on every rank (collective under
    FSDP), written by rank 0. A run that changed schedule part-way, being no fresh run, says so
    in its marker's fingerprint."""
    run_eval(trainer)
    trainer.metrics.close()  # every line on disk before the marker says the run is done
    # Measured, the drafter to write is the best one, on disk; else gather the last step's.
    weights = checkpoint.full_weights(trainer.drafter) if trainer.held_out is None else None
    out = trainer.paths.train_final
    if len(trainer.schedules) > 1:
        fingerprint = {**started.marker["fingerprint"], CONTINUED_KEY: trainer.schedules}
        started = replace(started, marker={**started.marker, "fingerprint": fingerprint})
    if trainer.world.is_main:
        facts = {"steps": trainer.step, "samples": len(trainer.source)}
        facts |= {"continued_from_step": resumed_at} if resumed_at else {}
        if trainer.best is not None:
            weights = checkpoint.read_weights(trainer.paths.train_best)
            facts |= {"selected_step": trainer.best["step"], "selected_tau": trainer.best["tau"]}
            log.info(
                "train/final is the drafter of step %d, with the best measured τ %.3f (of every %d steps and the last)",
                trainer.best["step"],
                trainer.best["tau"],
                trainer.cfg.eval_every,
            )
        checkpoint.write_drafter(weights, trainer.drafter.spec, out, lambda d: started.finish(d / MARKER, **facts))
        selected = trainer.best["step"] if trainer.best is not None else None
        plot_training(trainer.paths.train_metrics, trainer.paths.train_plot, selected)
    trainer.world.barrier()
    log.info("drafter written to %s", out)
    return {"step": trainer.step, "total_steps": trainer.total, "final": str(out), "eval": trainer.last_eval}


def workspace(paths: RunPaths, state: StageState, started: StageRun, redo: bool, world: World) -> RunPaths | None:
    """Where this run trains: ``train/`` when nothing finished is there or a finished run grows
    longer, else ``train.redo/`` beside the finished drafter, which stays whole until the new one
    replaces it. None when a redo had finished and is now swapped in.

    Rank 0 clears what must not be resumed — a directory made otherwise (refused unless
    ``redo``), or a swapped-out old one — while the other ranks wait.
    """
    resumable = _resumable(paths, started)
    in_place = state.status == "missing" or (state.extendable and resumable)
    work = paths if in_place else paths.rebuilding("train")
    swapped = False
    if world.is_main:
        recover_dir(paths.train_dir)
        left = read_marker(work.marker("train")) if not in_place else None
        if left is not None and digest(left) == digest(started.marker):
            replace_dir(work.train_dir, paths.train_dir)
            swapped = True
        elif left is not None or not (in_place and state.extendable):
            _clear_unless_resumable(work, started, redo)
    world.barrier()
    done = world.sum(torch.tensor([float(swapped)], device=world.device))[0].item() if world.distributed else swapped
    return None if done else work


def _resumable(paths: RunPaths, started: StageRun) -> bool:
    path = checkpoint.latest(paths.train_dir)
    return path is not None and checkpoint.made_with(path) == resume_key(started)


def _clear_unless_resumable(work: RunPaths, started: StageRun, redo: bool) -> None:
    """Keep the work directory only when its newest checkpoint continues this run; anything else
    there (a vocabulary, metrics, checkpoints of other data or settings) would be mixed in."""
    if not work.train_dir.exists() or _resumable(work, started):
        return
    path = checkpoint.latest(work.train_dir)
    if path is not None and not redo:
        made = checkpoint.made_with(path)
        changes = "; ".join(differences(made, resume_key(started))) if made else "made by an older eyas"
        raise StageError(
            f"{path}: made with other data or settings ({changes}); run `eyas train CONFIG --redo` to train anew, "
            "or restore them to resume"
        )
    if path is not None:
        log.info("discarding %s: its checkpoints were made with other data or settings", work.train_dir)
    shutil.rmtree(work.train_dir)


def steps_and_finish(trainer: Trainer, started: StageRun, quiet: bool, stop_after: int | None) -> dict:
    """Step to the end, or ``stop_after`` steps on with a checkpoint; finish at the end."""
    resumed_at = trainer.step
    cfg, total, world = trainer.cfg, trainer.total, trainer.world
    stop_at = total if stop_after is None else min(total, trainer.step + stop_after)
    with progress(quiet or not world.is_main, unit="tok") as bar:
        task = bar.add_task("train", total=total, completed=trainer.step, rate=0.0)
        while trainer.step < stop_at:
            row = train_step(trainer)
            trainer.metrics.write(row)
            bar.update(
                task,
                advance=1,
                rate=row["tokens_per_s"],
                description=f"train loss {row['loss']:.3f} acc {' '.join(f'{a:.2f}' for a in row['acc'][:3])}",
            )
            if trainer.step % cfg.checkpoint_every == 0 or trainer.step == stop_at:
                save_checkpoint(trainer)
            if trainer.step % cfg.eval_every == 0 and trainer.step < total:
                run_eval(trainer)
    if trainer.step < total:
        log.info("stopped at step %d of %d; rerun the same command to continue", trainer.step, total)
        return {"step": trainer.step, "total_steps": total, "final": None, "eval": None}
    return finish(trainer, started, resumed_at)


def train(
    config: RunConfig, world: World, quiet: bool = False, stop_after: int | None = None, redo: bool = False
) -> dict:
    """Build, resume, step to the end (or ``stop_after`` steps on, with a checkpoint), finish;
    when the drafter on disk is current already, say so and return it."""
    paths = RunPaths.of(config)
    family(config.train.drafter).require_trainable(config.train)
    started = begin(config, CONTRACT, paths)
    state = check(config, CONTRACT, paths)
    if state.status == "current":
        log.info("the drafter in %s is up to date", paths.train_final)
        steps = read_marker(paths.marker("train"))["run"].get("steps")
        return {"step": steps, "total_steps": steps, "final": str(paths.train_final), "eval": None}
    work = workspace(paths, state, started, redo, world)
    if work is None:
        log.info("a finished redo was swapped in: %s", paths.train_final)
        return {"step": None, "total_steps": None, "final": str(paths.train_final), "eval": None}
    trainer = build(config, world, work, started)
    if world.is_main:
        require_checkpoint_room(trainer)
    resume(trainer)
    with trainer.metrics:
        result = steps_and_finish(trainer, started, quiet, stop_after)
    if result["final"] is None:
        return result
    if work != paths and world.is_main:
        replace_dir(work.train_dir, paths.train_dir)
        log.info("the retrained drafter replaces the old one in %s", paths.train_dir)
    world.barrier()
    return {**result, "final": str(paths.train_final)}
