"""``eyas scaling`` on a small real corpus: subsets trained for their share, evaluated like eval,
the line fitted and priced; a rerun trains nothing again."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from eyas import scaling, train
from eyas.config import parse_config
from eyas.paths import RunPaths
from eyas.stage import StageError
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


def test_an_offline_runs_subsets_train_from_its_own_shards(merged_run):  # noqa: F811
    from eyas import extract
    from eyas.train.data import OfflineSource

    settings = tiny_config(merged_run, "offline", max_steps=4, epochs=10.0, eval_with_target=False)
    settings |= {"eval": {"max_new_tokens": 4, "max_prompts": 1}, "scaling": {"fractions": [0.5]}}
    config = parse_config(settings)
    extract.run(config, quiet=True)
    train.run(config, quiet=True)
    shards = sorted(RunPaths.of(config).hidden_dir.glob("*.safetensors"))
    report = scaling.run(config, quiet=True)
    assert [p["samples"] for p in report["points"]] == [4, 8]
    assert sorted(RunPaths.of(config).hidden_dir.glob("*.safetensors")) == shards, "nothing extracted again"
    (subset,) = [d for d in RunPaths.of(config).scaling_dir.glob("4-*") if (d / "train" / "final").is_dir()]
    paths = RunPaths.of(config.model_copy(update={"run_dir": str(subset)}))
    source = OfflineSource(paths, 64, torch.device("cpu"))
    merged = pq.read_table(paths.merge_dir / "train-00000.parquet", columns=["input_ids"]).column(0).to_pylist()
    assert len(source) == 4
    for i, ids in enumerate(merged):
        assert source.batch([i]).input_ids[0].tolist() == ids[:64], "row i of the subset, found by its id"

    rows = pq.read_table(paths.merge_dir / "train-00000.parquet")
    renamed = rows.set_column(
        rows.schema.get_field_index("id"), "id", pa.array(["elsewhere", *rows["id"][1:].to_pylist()])
    )
    pq.write_table(renamed, paths.merge_dir / "train-00000.parquet")
    with pytest.raises(StageError, match=r"hidden: 1 of the merged train split's 4 samples are not in the shards"):
        OfflineSource(paths, 64, torch.device("cpu"))
