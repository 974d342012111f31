"""``eyas scaling`` on a small real corpus: subsets trained for their share, evaluated like eval,
the line fitted and priced; a rerun trains nothing again."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from eyas import scaling, train
from eyas.config import parse_config
from eyas.paths import RunPaths
from tests.train.conftest import corpus_rows, merged_run, tiny_config  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow


def test_scaling_trains_nested_subsets_and_prices_a_target_tau(merged_run):  # noqa: F811
    settings = tiny_config(merged_run, max_steps=8, epochs=10.0, checkpoint_every=4, eval_every=4, tau_prompts=0)
    settings |= {
        "eval": {"max_new_tokens": 8, "max_prompts": 2},
        "scaling": {"fractions": [0.25, 0.5], "target_tau": [1.5]},
    }
    config = parse_config(settings)
    train.run(config, quiet=True)
    report = scaling.run(config, quiet=True)
    points = report["points"]
    assert [p["samples"] for p in points] == [2, 4, 8] and [p["steps"] for p in points] == [2, 4, 8]
    assert sum(p["steps"] for p in points[:-1]) <= points[-1]["steps"], "the subsets cost less than the full run"
    assert all(1.0 <= p["tau"] and p["prompts"] == 2 for p in points)
    subsets = sorted(RunPaths.of(config).scaling_dir.glob("*/merge/train-00000.parquet"))
    taken = [set(pq.read_table(f, columns=["id"]).column(0).to_pylist()) for f in subsets]
    taken.sort(key=len)
    assert [len(t) for t in taken] == [2, 4, 8] and taken[0] < taken[1] < taken[2], "nested, the run's own last"
    assert "per_doubling" in report["fit"] and report["predictions"][0]["tau"] == 1.5
    assert set(report["per_sample"]) >= {"train"}, "training's rate comes from its marker"
    assert (RunPaths.of(config).scaling_dir / "tau.png").is_file()

    trained = sorted(RunPaths.of(config).scaling_dir.glob("*/train/final/stage.json"))
    stamps = [f.stat().st_mtime_ns for f in trained]
    assert scaling.run(config, quiet=True)["points"] == points
    assert [f.stat().st_mtime_ns for f in trained] == stamps, "a rerun trains nothing again"
