import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eyas import merge
from eyas.config import ConfigError, RunConfig
from eyas.merge.plan import base_prompt_id
from eyas.merge.reader import held_out_prompts, iter_split, read_rows, split_files, split_lengths
from eyas.merge.shuffle import Buckets
from eyas.paths import MARKER, RunPaths
from eyas.records import TOKENIZED_COLUMNS
from eyas.space import EXIT_CODE as DISK_FULL
from eyas.stage import StageError, digest, read_marker
from tests.corpus import write_tokenized
from tests.disks import fill, small_disk
from tests.kills import kill_at_each
from tests.stages import mark_finished


def make_run(tmp_path, corpus_rows, datasets=None, **merge_cfg):
    paths = RunPaths(tmp_path / "run")
    for name, rows in corpus_rows.items():
        write_tokenized(paths.tokenized(name), rows)
    datasets = datasets or [{"name": n, "source": "unused.jsonl"} for n in corpus_rows]
    return RunConfig.model_validate({"run_dir": str(paths.root), "datasets": datasets, "merge": merge_cfg}), paths


def test_merge_writes_shuffled_splits_stats_and_holds_out_by_prompt(tmp_path, corpus_rows):
    config, paths = make_run(tmp_path, corpus_rows, eval_count=2, shard_samples=5)
    stats = merge.run(config, quiet=True)
    train, held_out = list(iter_split(paths, "train")), list(iter_split(paths, "eval"))
    assert [f.name for f in split_files(paths, "train")] == [
        "train-00000.parquet",
        "train-00001.parquet",
        "train-00002.parquet",
    ]
    assert set(train[0]) == set(TOKENIZED_COLUMNS)
    # Prompt "p3" in chat and math is one prompt: held out on both datasets or on neither.
    eval_prompts = {base_prompt_id(r["id"]) for r in held_out}
    assert len(eval_prompts) == 2 and len(held_out) == 4
    assert not eval_prompts & {base_prompt_id(r["id"]) for r in train}
    assert len(train) + len(held_out) == 16
    source = {r["id"]: r for rows in corpus_rows.values() for r in rows}
    for r in train + held_out:
        assert r["input_ids"] == source[r["id"]]["input_ids"] and r["loss_mask"] == source[r["id"]]["loss_mask"]
    assert [r["id"] for r in train] != sorted(r["id"] for r in train)  # shuffled, not file order
    on_disk = json.loads((paths.merge_dir / "stats.json").read_text())
    assert on_disk == json.loads(json.dumps(stats))
    assert stats["train"]["samples"] == 12 and stats["train"]["tokens"] == sum(len(r["input_ids"]) for r in train)
    assert stats["train"]["trainable_tokens"] == sum(sum(r["loss_mask"]) for r in train)
    assert sum(b["samples"] for b in stats["train"]["length_histogram"]) == 12
    assert split_lengths(paths, "train") == [len(r["input_ids"]) for r in train]
    assert read_rows(paths, "train", 4, 7) == train[4:7]
    assert not (paths.root / "merge.tmp").exists()


def test_same_seed_same_order_other_seed_other_order(tmp_path, corpus_rows):
    config, paths = make_run(tmp_path, corpus_rows, seed=1)
    merge.run(config, quiet=True)
    first = [r["id"] for r in iter_split(paths, "train")]
    merge.run(config, quiet=True)
    assert [r["id"] for r in iter_split(paths, "train")] == first
    merge.run(config.model_copy(update={"merge": config.merge.model_copy(update={"seed": 2})}), quiet=True)
    assert [r["id"] for r in iter_split(paths, "train")] != first


def test_truncate_keeps_masks_aligned_and_drop_counts(tmp_path, corpus_rows):
    prompt_len = corpus_rows["chat"][0]["loss_mask"].index(1)
    config, paths = make_run(tmp_path, corpus_rows, eval_fraction=0.0, max_seq_len=prompt_len + 2)
    stats = merge.run(config, quiet=True)
    source = {r["id"]: r for rows in corpus_rows.values() for r in rows}
    rows = list(iter_split(paths, "train"))
    for r in rows:
        full = source[r["id"]]
        n = len(r["input_ids"])
        assert n <= prompt_len + 2 and r["num_tokens"] == n
        assert r["input_ids"] == full["input_ids"][:n] and r["loss_mask"] == full["loss_mask"][:n]
        assert ("truncated" in r["flags"]) == (len(full["input_ids"]) > n)
    # Samples whose prompt alone fills the cap have nothing left to train on: dropped, counted.
    no_trainable = sum(1 for r in source.values() if 1 not in r["loss_mask"][: prompt_len + 2])
    assert stats["dropped"]["no_trainable"] == no_trainable == 16 - len(rows)

    config, paths = make_run(tmp_path, corpus_rows, eval_fraction=0.0, max_seq_len=prompt_len + 2, overflow="drop")
    stats = merge.run(config, quiet=True)
    assert all(len(r["input_ids"]) <= prompt_len + 2 for r in iter_split(paths, "train"))
    assert stats["dropped"]["too_long"] == sum(1 for r in source.values() if len(r["input_ids"]) > prompt_len + 2)


def test_weights_budgets_and_dropped_datasets(tmp_path, corpus_rows):
    budget = sum(len(r["input_ids"]) for r in corpus_rows["math"][:3])
    datasets = [
        {"name": "chat", "source": "x.jsonl", "weight": 2.0},
        {"name": "math", "source": "x.jsonl", "merge_token_budget": budget},
    ]
    config, paths = make_run(tmp_path, corpus_rows, datasets=datasets, eval_fraction=0.0)
    stats = merge.run(config, quiet=True)
    rows = list(iter_split(paths, "train"))
    chat = [r["id"] for r in rows if r["dataset"] == "chat"]
    assert len(chat) == 16 and len(set(chat)) == 16 and sum(i.endswith("@1") for i in chat) == 8
    math_tokens = sum(r["num_tokens"] for r in rows if r["dataset"] == "math")
    assert 0 < math_tokens <= budget
    assert stats["datasets"]["math"]["dropped"]["token_budget"] == 8 - sum(r["dataset"] == "math" for r in rows)

    datasets = [
        {"name": "chat", "source": "x.jsonl", "weight": 0.5},
        {"name": "math", "source": "x.jsonl", "drop": True},
    ]
    config, paths = make_run(tmp_path, corpus_rows, datasets=datasets, eval_fraction=0.0)
    stats = merge.run(config, quiet=True)
    assert {r["dataset"] for r in iter_split(paths, "train")} == {"chat"}
    assert stats["train"]["samples"] + stats["dropped"]["weight"] == 8 and "math" not in stats["datasets"]


def test_bad_inputs_are_errors_that_name_the_file(tmp_path, corpus_rows):
    config, paths = make_run(
        tmp_path,
        {"chat": corpus_rows["chat"]},
        datasets=[{"name": "chat", "source": "x.jsonl"}, {"name": "gone", "source": "x.jsonl"}],
    )
    with pytest.raises(StageError, match=r"tokenize/gone\.parquet: no tokenized data"):
        merge.run(config, quiet=True)
    with pytest.raises(StageError, match="run `eyas merge CONFIG` first"):
        list(iter_split(paths, "train"))
    rows = [dict(r) for r in corpus_rows["chat"]]
    rows[3]["loss_mask"] = rows[3]["loss_mask"][:-1]
    write_tokenized(paths.tokenized("chat"), rows)
    config = config.model_copy(update={"datasets": config.datasets[:1]})
    with pytest.raises(StageError, match=r"chat\.parquet: row 3: loss_mask and input_ids differ"):
        merge.run(config, quiet=True)
    write_tokenized(paths.tokenized("chat"), corpus_rows["chat"])
    with pytest.raises(ConfigError, match="merge.eval_count: 99 is more than the 8 prompt ids"):
        merge.run(config.model_copy(update={"merge": config.merge.model_copy(update={"eval_count": 99})}), quiet=True)


def test_row_groups_are_small_so_ranges_read_little(tmp_path, corpus_rows):
    config, paths = make_run(tmp_path, corpus_rows)
    merge.run(config, quiet=True)
    assert pq.ParquetFile(split_files(paths, "train")[0]).metadata.row_group(0).num_rows <= 1024


def test_buckets_yield_the_global_key_order_whatever_their_count(tmp_path):
    keys = np.random.default_rng(0).integers(0, 2**63, 500, dtype=np.uint64) * np.uint64(2)
    table = pa.table({"n": pa.array(np.arange(500))})
    orders = []
    for count in (1, 4, 16):
        buckets = Buckets(tmp_path / str(count), "train", count, table.schema, flush_bytes=64)
        for start in range(0, 500, 37):
            buckets.add(table.slice(start, 37), keys[start : start + 37])
        buckets.close()
        assert len(list((tmp_path / str(count)).iterdir())) == count
        orders.append([n for t in buckets.sorted_tables() for n in t.column("n").to_pylist()])
    assert orders[0] == orders[1] == orders[2] == np.argsort(keys, kind="stable").tolist()


def test_cli_reports_a_missing_input_as_an_error_line_and_its_own_exit_code(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("run_dir: run\ndatasets:\n  - {name: chat, source: x.jsonl}\n")
    result = subprocess.run([sys.executable, "-m", "eyas", "merge", str(config)], capture_output=True, text=True)
    # The config is valid; the stage's input is missing: not the bad-config exit code (2).
    assert result.returncode == StageError.EXIT_CODE and "Traceback" not in result.stderr
    message = result.stderr.replace("\n", "")  # rich wraps long lines
    assert message.startswith("error:") and "merge: its input from stage generate is missing" in message


def test_held_out_prompts_take_each_dataset_in_turn(tmp_path, corpus_rows):
    config, paths = make_run(tmp_path, corpus_rows, eval_fraction=0.5)
    merge.run(config, quiet=True)
    every = held_out_prompts(paths, None)
    datasets = [d for _, d, _ in every]
    assert len(every) == 8 and sorted(datasets[:2]) == ["chat", "math"]
    assert all(a != b for a, b in zip(datasets, datasets[1:]))  # whichever came first, they alternate
    assert [d for _, d, _ in held_out_prompts(paths, 3)] == datasets[:3]
    source = {r["id"]: r for rows in corpus_rows.values() for r in rows}
    for rid, _, prompt in every:
        assert prompt == source[rid]["input_ids"][: source[rid]["loss_mask"].index(1)]


def test_every_answer_to_a_prompt_lands_on_its_side_and_is_decoded_once(tmp_path, corpus_rows):
    """``generate.samples_per_prompt`` writes ``<id>~<j>`` beside ``<id>``: held out by the row,
    so no answer to a held-out prompt is trained on, and eval decodes that prompt once."""
    from eyas.records import sample_prompt_id

    rows = []
    for row in corpus_rows["chat"]:
        for j in range(3):
            rows.append({**row, "id": "chat/" + sample_prompt_id(row["id"].split("/", 1)[1], j)})
    config, paths = make_run(tmp_path, {"chat": rows}, eval_count=2)
    merge.run(config, quiet=True)
    held_out, train = list(iter_split(paths, "eval")), list(iter_split(paths, "train"))
    assert len(held_out) == 6
    assert len({base_prompt_id(r["id"]) for r in held_out}) == 2
    assert not {base_prompt_id(r["id"]) for r in held_out} & {base_prompt_id(r["id"]) for r in train}
    assert len(held_out_prompts(paths, None)) == 2


def test_a_rows_prompt_id_drops_its_turn_and_answer_numbers():
    from eyas.records import row_prompt_id, sample_prompt_id

    assert sample_prompt_id("abc", 0) == "abc" and sample_prompt_id("abc", 2) == "abc~2"
    assert sample_prompt_id("abc#1", 2) == "abc~2#1"
    for prompt_id in ("abc", "abc~2", "abc#1", "abc~2#1"):
        assert row_prompt_id(prompt_id) == "abc" and base_prompt_id(f"ds/{prompt_id}") == "abc"
    assert row_prompt_id("a~b") == "a~b" and row_prompt_id("q#x") == "q#x"


def merged_files(paths: RunPaths) -> dict:
    """The merge on disk, file by file (the run directory written as ``<run>``: stats name their
    sources), and its marker by digest (the marker also records the time taken)."""
    files = {
        f.name: f.read_bytes().replace(bytes(paths.root), b"<run>")
        for f in sorted(paths.merge_dir.glob("*"))
        if f.name != MARKER
    }
    marker = read_marker(paths.marker("merge"))
    return files | {MARKER: digest(marker) if marker else None}


def reseeded_run(root, corpus_rows) -> tuple[RunPaths, Path, dict]:
    """A run merged with seed 1 that `eyas merge` accepts (its inputs' markers and files in place),
    a config file asking for seed 2, and the files an uninterrupted merge of it writes (in a copy)."""
    config, paths = make_run(root, corpus_rows, seed=1, shard_samples=3)
    for name in corpus_rows:  # what `eyas merge` checks its inputs by; the rows are the tokenized files'
        paths.generations(name).parent.mkdir(exist_ok=True)
        paths.generations(name).touch()
    paths.tokenize_report.write_text("{}")
    mark_finished(config, "generate", "tokenize")
    merge.run(config, quiet=True)
    reseeded = config.model_copy(update={"merge": config.merge.model_copy(update={"seed": 2})})
    uninterrupted = RunPaths(shutil.copytree(paths.root, root / "uninterrupted"))
    merge.run(reseeded.model_copy(update={"run_dir": str(uninterrupted.root)}), quiet=True)
    path = root / "run.yaml"
    path.write_text(json.dumps(reseeded.model_dump(mode="json")))
    return paths, path, merged_files(uninterrupted)


@pytest.mark.slow
def test_a_merge_killed_at_any_point_leaves_the_old_corpus_or_the_new_never_a_mix(tmp_path, corpus_rows):
    paths, path, uninterrupted = reseeded_run(tmp_path, corpus_rows)
    old = merged_files(paths)
    aside = paths.root / "merge.tmp"
    kill_points = [
        lambda: aside.is_dir(),
        lambda: (aside / "train-00000.parquet").exists(),
        lambda: (aside / "stats.json").exists(),
        lambda: (aside / MARKER).exists(),
    ]
    command = [sys.executable, "-m", "eyas", "merge", str(path), "-q", "--redo"]
    seen = kill_at_each(command, kill_points, lambda: merged_files(paths), old)
    assert seen[0] == "old", seen
    if seen[-1] == "new":  # the merge finished before the last kill: the new corpus, whole
        assert merged_files(paths) == uninterrupted
    else:  # the last kill landed mid-merge, leaving its work aside
        assert aside.is_dir()
    assert subprocess.run(command).returncode == 0
    assert merged_files(paths) == uninterrupted != old
    assert not aside.exists() and not paths.root.joinpath("merge.old").exists()


@pytest.mark.slow
def test_a_merge_on_a_full_disk_exits_7_naming_where_it_wrote_and_keeps_the_old_corpus(tmp_path, corpus_rows):
    with small_disk(tmp_path / "disk", "16M") as disk:
        paths, path, uninterrupted = reseeded_run(disk, corpus_rows)
        old = merged_files(paths)
        ballast = fill(disk)
        command = [sys.executable, "-m", "eyas", "merge", str(path), "-q", "--redo"]
        done = subprocess.run(command, capture_output=True, text=True)
        said = "".join((done.stdout + done.stderr).split())  # rich wraps a long path anywhere
        assert done.returncode == DISK_FULL, said
        assert f"thediskisfullwriting{paths.root / 'merge.tmp'}" in said and "Traceback" not in said, said
        assert merged_files(paths) == old
        assert not (paths.root / "merge.tmp").exists(), "what was built aside gives its room back"
        ballast.unlink()
        assert subprocess.run(command).returncode == 0
        assert merged_files(paths) == uninterrupted
