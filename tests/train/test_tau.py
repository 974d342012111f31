"""The drafter kept is the one with the best τ measured on held-out prompts during training."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from eyas import train
from eyas.paths import RunPaths
from eyas.stage import read_marker
from eyas.train.checkpoint import checkpoints_dir
from eyas.train.metrics import read_metrics

from .conftest import load_tiny, write_merged

STEPS = 24


def test_a_run_that_gets_worse_keeps_the_earlier_drafter_with_the_higher_tau(tmp_path, corpus_rows):
    """The held-out prompts are the training prompts, so the drafter's τ on them climbs early;
    the learning rate then warms up to a value that wrecks what it learned, so later steps
    measure lower. Final must be the earlier drafter, not the last."""
    train_rows, _ = corpus_rows
    run = write_merged(tmp_path / "run", train_rows, train_rows)
    settings = {"max_steps": STEPS, "epochs": 100, "eval_every": 4, "checkpoint_every": STEPS, "cache_states": True}
    config = load_tiny(run, lr=0.1, warmup_ratio=0.95, tau_prompts=4, **settings)
    train.run(config, quiet=True)
    paths = RunPaths.of(config)
    taus = {r["step"]: r["tau"] for r in read_metrics(paths.train_metrics, "tau")}
    assert list(taus) == list(range(4, STEPS + 1, 4))
    best = min(taus, key=lambda step: (-taus[step], step))
    assert taus[best] > taus[STEPS], f"the setup must make the run worse late: {taus}"
    assert read_marker(paths.marker("train"))["run"]["selected_step"] == best
    final = load_file(paths.train_final / "model.safetensors")
    kept = load_file(paths.train_best / "model.safetensors")
    last = load_file(checkpoints_dir(paths.train_dir) / f"step-{STEPS:08d}" / "model.safetensors")
    assert all(torch.equal(final[k], kept[k]) for k in final)
    assert not all(torch.equal(final[k], last[k]) for k in final)
    assert paths.train_plot.is_file()
    # Scaling measures the run on those same held-out prompts: it takes the last step, as its subsets'.
    assert train.last_step_drafter(config) == checkpoints_dir(paths.train_dir) / f"step-{STEPS:08d}"
    short = settings | {"max_steps": 2, "checkpoint_every": 2}
    unmeasured = load_tiny(write_merged(tmp_path / "plain", train_rows, train_rows), tau_prompts=0, **short)
    train.run(unmeasured, quiet=True)
    assert train.last_step_drafter(unmeasured) == RunPaths.of(unmeasured).train_final
