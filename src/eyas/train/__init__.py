"""Stage 6 — train: the drafter (EAGLE-3 by training-time test, DFlash by anchored blocks), on the
target's own outputs.

Consumes the merged corpus (``<run_dir>/merge/{train,eval}-*.parquet``) and either the target
itself (``extract.mode: online``: hidden states computed per batch, never stored) or its
extracted shards (``offline``: ``<run_dir>/hidden``).

Produces under ``<run_dir>/train/``: ``vocab.safetensors`` (the draft vocabulary, reused on
resume), ``checkpoints/step-N/`` (the two newest), ``metrics.jsonl`` (per step: loss,
per-step top-1 accuracy, simulated acceptance length, lr, tokens/s; per evaluation on the
eval split: the same, and τ measured by speculative decoding on held-out prompts), ``best/``
(the drafter with the best measured τ so far, :mod:`eyas.train.tau`), ``training.png`` (loss,
accuracy and τ against steps) and ``final/`` — the drafter with the best measured τ (the last
step's when τ is not measured) in its family's SGLang/vLLM layout, loadable with
:func:`eyas.drafter.families.load_drafter`.

Guarantees: an interrupted run continues from its newest checkpoint exactly as if it had
never stopped (weights, optimizer, scheduler, RNG and data position); the same command
under ``torchrun`` trains data-parallel with the gradient of one process on the global batch.
A finished drafter is never rewritten from a checkpoint made with other data or settings: a
longer run (``train.max_steps`` or ``train.epochs`` raised) continues from the newest
checkpoint, its marker recording that it was continued (:data:`CONTINUED_KEY`); anything
else retrains in ``train.redo/``, swapped in whole when it finishes, so a crash at any moment
leaves the old drafter with its marker or the new one with its own.
"""

from __future__ import annotations

from pathlib import Path

from eyas.config import RunConfig
from eyas.stage import StageContract, flat
from eyas.target import resolved_here

SPEED_KEYS = {"checkpoint_every", "eval_every", "eval_with_target", "parallel", "cache_states"}
"""``train.*`` keys that change how the run is saved, reported, parallelised or fed, not the
weights it ends with: checkpoints and evaluations draw no random numbers, DDP and FSDP compute
the gradient of one process on the global batch, and cached states are the states computed.
(The evaluation keys do choose the final drafter when it is the one with the best τ: see
:func:`fingerprint`.)"""
TAU_KEYS = {"tau_prompts", "tau_draft_tokens", "tau_new_tokens"}
"""``train.*`` keys that only measure τ during training: they choose the final drafter when it is
the one with the best τ (:func:`selects_by_tau`) and change nothing otherwise, so
:func:`fingerprint` holds them only then (and ``train.tau_prompts`` as 0 when τ is not measured)."""
LENGTH_KEYS = ("train.max_steps", "train.epochs")
"""Raising these continues a finished run from its newest checkpoint (the learning-rate
schedule is recomputed for the new length, from the step reached); lowering them retrains."""
CONTINUED_KEY = "train.continued"
"""In the marker of a drafter whose run was continued to a longer length: ``[first step, steps
its schedule runs to]`` for each part of the run trained under one learning-rate schedule. A
continued drafter is not the one a fresh run of the new length trains — its first steps
followed a shorter schedule, and τ was measured where the shorter run ended — so this key keeps
its digest apart from a fresh run's. No config sets it (:func:`history`)."""


def runs_target(config: RunConfig) -> bool:
    """Whether training loads the target model itself: online for the states, or to evaluate with it."""
    return config.extract.mode != "offline" or bool(config.train.eval_with_target)


def selects_by_tau(config: RunConfig) -> bool:
    """Whether ``train/final`` is the drafter with the best measured τ (:mod:`eyas.train.tau`),
    which needs the target in this process, rather than the last step."""
    return config.train.tau_prompts > 0 and runs_target(config)


def fingerprint(config: RunConfig) -> dict:
    """Every hyperparameter the family trains with, and where the states come from: offline,
    extract's marker names the target and layers; online, this stage runs the target itself.
    The keys only other families read are left out, and those the family itself leaves out
    (:meth:`~eyas.drafter.family.Family.left_out`).
    τ's settings, and which steps are measured, count only when the final drafter is the one
    with the best τ; otherwise ``train.tau_prompts`` is 0 however many the config names, so
    turning the measurement on reads as that key going from 0."""
    from eyas.drafter.families import FAMILIES

    cfg, by_tau = config.train, selects_by_tau(config)
    family = FAMILIES[cfg.drafter]
    # Other families' own keys are out, so tuning one never retrains another.
    others = set().union(*(f.reads for f in FAMILIES.values())) - family.reads
    left_out = SPEED_KEYS | TAU_KEYS | others | family.left_out(cfg) | cfg.unused_recipe_keys()
    keys = {**flat("train", cfg.fingerprinted(left_out)), "extract.mode": config.extract.mode}
    if cfg.init_from:
        from eyas.drafter.layout import content_digest

        # The source by content, not path: a drafter retrained in place makes this run stale.
        keys["train.init_from"] = content_digest(Path(cfg.init_from)) or "missing"
    keys["train.tau_prompts"] = cfg.tau_prompts if by_tau else 0
    if by_tau:
        measured = ("tau_draft_tokens", "tau_new_tokens", "eval_every", "eval_with_target")
        keys |= {f"train.{key}": getattr(cfg, key) for key in measured}
    if config.extract.mode == "online":
        from eyas.target import aux_layers, served_identity

        keys |= served_identity(config.target)
        keys["extract.aux_layers"] = aux_layers(config.target, config.extract.aux_layers)
    return keys


def is_longer(old: dict, new: dict) -> bool:
    """Whether a drafter trained under fingerprint ``old`` can be continued to ``new``: only the
    run's length changed, and it grew."""
    changed = {k for k in {*old, *new} if old.get(k) != new.get(k)}
    return changed <= set(LENGTH_KEYS) and all(_not_shorter(old.get(k), new.get(k)) for k in changed)


def _not_shorter(old, new) -> bool:
    """``max_steps: null`` is no limit."""
    return new is None or (old is not None and new >= old)


def history(fingerprint: dict) -> dict[str, str]:
    """How a finished drafter's run was continued, in words for ``eyas status``."""
    parts = fingerprint.get(CONTINUED_KEY)
    if not parts:
        return {}
    followed = ", then ".join(f"a {total}-step one from step {start}" for start, total in parts)
    ended = [start for (_, total), (start, _) in zip(parts, parts[1:]) if start == total]
    tau = (
        f", and τ was also measured where a shorter run ended (step {', '.join(map(str, ended))})"
        if ended and "train.eval_every" in fingerprint
        else ""
    )
    return {
        CONTINUED_KEY: f"continued from a shorter run, so not the drafter a fresh run trains: its learning-rate "
        f"schedule was {followed}{tau}; delete its train directory to train it fresh"
    }


def inputs(config: RunConfig) -> list[str]:
    return ["merge", "extract"] if config.extract.mode == "offline" else ["merge"]


CONTRACT = StageContract(
    "train",
    inputs,
    fingerprint,
    lambda c, p: [p.train_final / "config.json", p.train_final / "model.safetensors"],
    extends=is_longer,
    history=history,
    resolved=resolved_here,
)


def run(config: RunConfig, quiet: bool = False, stop_after: int | None = None, redo: bool = False) -> dict:
    """Train (or resume) the drafter; returns ``{step, total_steps, final, eval}``.

    ``stop_after``: stop cleanly after this many optimizer steps in this invocation, with a
    checkpoint (for time-boxed jobs); the next run continues from there. ``redo``: checkpoints
    in progress that were made otherwise are discarded instead of refused.
    """
    from eyas.train.distributed import setup, teardown
    from eyas.train.loop import train

    world = setup(config.target)
    try:
        return train(config, world, quiet, stop_after, redo)
    finally:
        teardown(world)


def last_step_drafter(config: RunConfig) -> Path:
    """The finished run's drafter at its last step: ``train/final`` when training kept that one,
    else (training picked the step with the best τ on the first ``train.tau_prompts`` held-out
    prompts) the checkpoint written at the last step. An estimate measured on those prompts, as
    scaling's is, would otherwise read the selection's luck as the run's τ."""
    from eyas.paths import RunPaths
    from eyas.stage import StageError, read_marker
    from eyas.train import checkpoint

    paths = RunPaths.of(config)
    run = read_marker(paths.marker("train"))["run"]
    if "selected_step" not in run:
        return paths.train_final
    last = checkpoint.latest(paths.train_dir)
    if last is None or last.name != checkpoint.step_name(run["steps"]):
        raise StageError(
            f"{paths.train_final}: chosen by τ at step {run['selected_step']}, and the checkpoint of its last step "
            f"({run['steps']}) is gone from {checkpoint.checkpoints_dir(paths.train_dir)}; retrain with "
            "`eyas train CONFIG --redo` to measure the run's own last step"
        )
    return last
