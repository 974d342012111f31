"""What a drafter's marker holds: the settings its family trains with, no others, named as written."""

from __future__ import annotations

from pathlib import Path

import eyas.train
from eyas import pipeline
from eyas.files import write_json_atomic
from eyas.paths import RunPaths
from eyas.stage import StageState, check, read_marker
from tests.stages import mark_finished
from tests.train.conftest import load_tiny


def finished(run_dir: Path, **train) -> None:
    """A train marker (over a merge marker) as if a run with these settings had just finished."""
    config = load_tiny(run_dir, **train)
    paths = RunPaths.of(config)
    mark_finished(config, "merge", "train")
    for output in eyas.train.CONTRACT.outputs(config, paths):
        output.touch()


def status(run_dir: Path, **train) -> StageState:
    """The train row of ``eyas status`` under these settings."""
    config = load_tiny(run_dir, **train)
    return check(config, eyas.train.CONTRACT, RunPaths.of(config))


def test_dflash_is_current_whatever_the_learning_rate_it_does_not_train_at(tmp_path):
    """DFlash's fingerprint kept ``train.lr`` when ``train.dflash.lr`` was set: tuning EAGLE-3's
    rate in a run of both families retrained DFlash for nothing."""
    dflash = {"drafter": "dflash", "dflash": {"lr": 2e-3}}
    finished(tmp_path, **dflash)
    assert status(tmp_path, lr=1e-4, **dflash).status == "current"
    assert status(tmp_path, drafter="dflash", dflash={"lr": 1e-3}).changes == ["train.dflash.lr: 0.002 → 0.001"]


def test_settings_of_a_tau_nobody_measures_leave_the_drafter_current(tmp_path):
    """With ``tau_prompts: 0`` the final drafter is the last step whatever the other ``tau_*``
    keys say; they were fingerprinted anyway."""
    finished(tmp_path, tau_prompts=0)
    assert status(tmp_path, tau_prompts=0, tau_new_tokens=8, tau_draft_tokens=2).status == "current"
    measured = status(tmp_path, tau_prompts=4)
    assert measured.status == "stale" and "train.tau_prompts: 0 → 4" in measured.changes


def test_tau_settings_count_where_tau_picks_the_drafter(tmp_path):
    finished(tmp_path, tau_prompts=4)
    assert status(tmp_path, tau_prompts=4, tau_new_tokens=8).changes == ["train.tau_new_tokens: 16 → 8"]


def test_eagle3_1_options_retrain_eagle3_only_and_leave_eagle3_drafters_current(tmp_path):
    """EAGLE-3 as published keeps the fingerprint it had before ``train.eagle3`` existed; setting an
    EAGLE-3.1 option is named as written, and a DFlash drafter does not read them."""
    finished(tmp_path / "eagle3")
    assert status(tmp_path / "eagle3", eagle3={"norm_before_fc": False}).status == "current"
    assert status(tmp_path / "eagle3", eagle3={"norm_before_fc": True}).changes == [
        "train.eagle3.norm_before_fc: (default) → true",
        "train.eagle3.norm_output: (default) → false",
    ]
    finished(tmp_path / "dflash", drafter="dflash")
    assert status(tmp_path / "dflash", drafter="dflash", eagle3={"norm_output": True}).status == "current"


def test_an_eagle3_1_drafter_stays_current_when_norm_before_residual_is_added(tmp_path):
    """``train.eagle3.norm_before_residual`` came after EAGLE-3.1's switches: a drafter trained with
    them keeps its fingerprint while it is off, and turning it on is named."""
    finished(tmp_path, eagle3={"norm_before_fc": True})
    assert status(tmp_path, eagle3={"norm_before_fc": True, "norm_before_residual": False}).status == "current"
    assert status(tmp_path, eagle3={"norm_before_fc": True, "norm_before_residual": True}).changes == [
        "train.eagle3.norm_before_residual: (default) → true"
    ]


def test_each_family_reads_only_its_own_settings(tmp_path):
    """DSpark's settings leave EAGLE-3 and DFlash drafters current, and theirs leave DSpark's;
    ``train.draft_vocab_size``, which EAGLE-3 and DSpark both read, retrains both."""
    for family in ("eagle3", "dflash", "dspark"):
        finished(tmp_path / family, drafter=family)
        for other, setting in {
            "dflash": {"layers": 2},
            "dspark": {"markov_rank": 8},
            "eagle3": {"norm_output": True},
        }.items():
            if other != family:
                assert status(tmp_path / family, drafter=family, **{other: setting}).status == "current", (
                    family,
                    other,
                )
    assert status(tmp_path / "dspark", drafter="dspark", dspark={"markov_rank": 8}).changes == [
        "train.dspark.markov_rank: 256 → 8"
    ]
    for family, stale in (("eagle3", True), ("dflash", False), ("dspark", True)):
        assert (status(tmp_path / family, drafter=family, draft_vocab_size=64).status == "stale") is stale, family


def test_a_continued_drafter_is_adopted_when_the_run_gains_a_family(tmp_path):
    """A continued drafter's marker holds ``train.continued``, which no config sets: the check
    that moves the drafter to ``<run_dir>/eagle3/`` compares it as ``eyas status`` does, so the
    drafter is moved, not retrained."""
    finished(tmp_path)
    marker_path = RunPaths.of(load_tiny(tmp_path)).marker("train")
    continued = read_marker(marker_path)
    continued["fingerprint"]["train.continued"] = [[0, 1], [1, 2]]
    write_json_atomic(marker_path, continued)
    eagle3 = load_tiny(tmp_path, drafter=["eagle3", "dflash"]).drafter_views()[0]
    assert pipeline.adoptable(eagle3) == tmp_path / "train"


def test_a_drafter_trained_before_the_recipe_keys_existed_stays_current_until_one_changes(tmp_path):
    """``train.loss``, ``position_weighting``, ``optimizer`` and ``keep`` at what every earlier run trained
    with are left out of the marker, so adding them retrained nothing; a change names the key,
    and a setting of a loss, weighting or optimizer not chosen never counts."""
    finished(tmp_path)
    marker = read_marker(RunPaths.of(load_tiny(tmp_path)).marker("train"))
    assert not {"train.loss", "train.optimizer", "train.position_weighting"} & set(marker["fingerprint"])
    assert status(tmp_path, lk_eta=5.0, dpace_alpha=0.2, muon_lr=0.01).status == "current"
    assert status(tmp_path, loss={"ce": 0.1, "tv": 0.9}).changes == [
        "train.loss.ce: (default) → 0.1",
        "train.loss.tv: (default) → 0.9",
    ]
    changed = status(tmp_path, loss="lk_hybrid", position_weighting="dpace", optimizer="muon")
    assert changed.changes == [
        "train.dpace_alpha: (default) → 0.5",
        "train.lk_eta: (default) → 3.0",
        'train.loss: (default) → "lk_hybrid"',
        "train.muon_lr: (default) → null",
        'train.optimizer: (default) → "muon"',
        'train.position_weighting: (default) → "dpace"',
    ]
    assert status(tmp_path, keep_by="random").status == "current"
    assert status(tmp_path, keep=0.5).changes == [
        "train.keep: (default) → 0.5",
        'train.keep_by: (default) → "flatness"',
    ]
