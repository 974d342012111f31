"""The records file holds exactly today's prompt selection: records the config no longer selects
go aside (never deleted), and come back, not regenerated, when the config selects them again."""

import pytest
import yaml

from eyas import generate
from eyas.config import load_config
from eyas.generate.store import read_records
from eyas.paths import RunPaths
from eyas.pipeline import statuses
from eyas.stage import StageError
from tests.conftest import write_jsonl

ROWS = [
    {"id": f"row-{i}", "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
    for i, (q, a) in enumerate([("What is 2+2?", "4"), ("Name a color.", "Red."), ("Say hello.", "Hello!")])
]


def write_run(tmp_path, rows=ROWS, target=None, **dataset):
    write_jsonl(tmp_path / "rows.jsonl", rows)
    data = {
        "run_dir": "run",
        "target": {"model": "embedded", "device": "cpu", **(target or {})},
        "datasets": [{"name": "qa", "source": "rows.jsonl", **dataset}],
        "generate": {"backend": "local", "max_tokens": 6, "batch_size": 3},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(data))
    return load_config(tmp_path / "run.yaml")


def records(config):
    return {r.id: r for r in read_records(RunPaths.of(config).generations("qa"))}


def set_aside(config):
    folders = sorted(RunPaths.of(config).generate_dir.glob("superseded-*"))
    return [r.id for folder in folders for r in read_records(folder / "qa.jsonl")]


def test_regenerate_turned_on_replaces_the_datasets_own_answers(tmp_path):
    config = write_run(tmp_path, regenerate=False)
    generate.run(config, quiet=True)
    assert {r.provider for r in records(config).values()} == {"dataset"}

    config = write_run(tmp_path)
    assert "datasets[qa].regenerate: false → (default)" in statuses(config)["generate"].why
    generate.run(config, quiet=True)
    assert {r.provider for r in records(config).values()} == {"local"}
    assert sorted(set_aside(config)) == sorted(f"qa/row-{i}" for i in range(3))


def test_as_is_rows_removed_or_edited_leave_no_old_record(tmp_path):
    config = write_run(tmp_path, regenerate=False)
    generate.run(config, quiet=True)
    edited = [ROWS[0], {**ROWS[1], "messages": [ROWS[1]["messages"][0], {"role": "assistant", "content": "Blue."}]}]
    config = write_run(tmp_path, rows=edited, regenerate=False)
    generate.run(config, quiet=True)
    now = records(config)
    assert sorted(now) == ["qa/row-0", "qa/row-1"] and now["qa/row-1"].content == "Blue."
    assert sorted(set_aside(config)) == ["qa/row-1", "qa/row-2"]


def test_lower_max_prompts_sets_records_aside_and_raising_it_takes_them_back(tmp_path):
    config = write_run(tmp_path)
    generate.run(config, quiet=True)
    first = records(config)

    config = write_run(tmp_path, max_prompts=2)
    assert "datasets[qa].max_prompts: null → 2" in statuses(config)["generate"].why
    generate.run(config, quiet=True)
    assert sorted(records(config)) == ["qa/row-0", "qa/row-1"] and set_aside(config) == ["qa/row-2"]

    config = write_run(tmp_path)
    generate.run(config, quiet=True)
    # Taken back whole, not regenerated: the same record, its creation time included.
    assert records(config) == first


def test_lower_output_token_target_keeps_the_records_before_it(tmp_path):
    config = write_run(tmp_path)
    generate.run(config, quiet=True)
    first = list(records(config).values())
    config = write_run(tmp_path, output_token_target=first[0].usage.completion_tokens)
    generate.run(config, quiet=True)
    assert list(records(config).values()) == first[:1]
    assert len(set_aside(config)) == 2


@pytest.mark.parametrize("key", ["revision", "tokenizer"])
def test_the_targets_revision_and_tokenizer_are_generation_settings(tmp_path, key):
    config = write_run(tmp_path, regenerate=False)
    generate.run(config, quiet=True)
    config = write_run(tmp_path, target={key: "other"})
    with pytest.raises(StageError, match=f"target.{key}: None -> 'other'"):
        generate.run(config, quiet=True)
