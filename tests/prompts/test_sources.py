import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from eyas.config import ConfigError, DatasetConfig
from eyas.prompts import PromptStats, iter_prompts, load_prompts
from eyas.records import content_hash
from tests.conftest import write_jsonl


def dataset(path, **kw):
    return DatasetConfig(name="d", source=str(path), **kw)


def test_every_row_format_becomes_openai_messages(tmp_path):
    rows = [
        {"id": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
        {"id": "s", "conversations": [{"from": "human", "value": "Hello"}, {"from": "gpt", "value": "Hey"}]},
        {"id": "p", "prompt": "Tell me a joke", "system": "You are funny."},
        {"id": "i", "instruction": "Translate to French", "input": "cat"},
    ]
    prompts, stats = load_prompts(dataset(write_jsonl(tmp_path / "a.jsonl", rows)))
    by_id = {p.prompt_id: p.messages for p in prompts}
    assert by_id["m"] == rows[0]["messages"]
    assert by_id["s"] == [{"role": "user", "content": "Hello"}]  # the final assistant turn is what gets regenerated
    assert by_id["p"] == [
        {"role": "system", "content": "You are funny."},
        {"role": "user", "content": "Tell me a joke"},
    ]
    assert by_id["i"] == [{"role": "user", "content": "Translate to French\n\ncat"}]
    assert stats.prompts == 4 and not stats.skipped


def test_prompt_id_is_the_rows_own_id_else_a_stable_content_hash(tmp_path):
    rows = [{"uuid": "u-1", "prompt": "a"}, {"prompt": "b"}]
    prompts, _ = load_prompts(dataset(write_jsonl(tmp_path / "a.jsonl", rows)))
    assert prompts[0].prompt_id == "u-1"
    assert prompts[1].prompt_id == content_hash({"messages": [{"role": "user", "content": "b"}], "tools": None})
    again, _ = load_prompts(dataset(tmp_path / "a.jsonl"))
    assert [p.prompt_id for p in again] == [p.prompt_id for p in prompts]
    assert prompts[0].record_id == "d/u-1"


def test_duplicates_are_dropped_and_counted(tmp_path):
    rows = [
        {"prompt": "same"},
        {"prompt": "same"},
        {"prompt": "other"},
        {"id": "x", "prompt": "1"},
        {"id": "x", "prompt": "2"},
    ]
    prompts, stats = load_prompts(dataset(write_jsonl(tmp_path / "a.jsonl", rows)))
    assert len(prompts) == 3
    assert stats.duplicates == 2


def test_malformed_rows_are_reported_with_file_line_and_reason(tmp_path, caplog):
    path = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "ok"}, "{not json", {"prompt": ""}, {"text": "no field"}])
    stats = PromptStats()
    with caplog.at_level(logging.WARNING, logger="eyas"):
        prompts = list(iter_prompts(dataset(path), stats))
    assert len(prompts) == 1
    assert [loc for loc, _ in stats.skipped] == [f"{path}:2", f"{path}:3", f"{path}:4"]
    assert "not valid JSON" in stats.skipped[0][1]
    assert "'prompt' must be a non-empty string" in stats.skipped[1][1]
    assert "no known prompt field" in stats.skipped[2][1]
    assert f"{path}:2: skipped row: not valid JSON" in caplog.text


def test_a_line_that_is_not_utf8_or_is_cut_short_is_a_row_skipped_with_its_line(tmp_path):
    """A non-UTF-8 byte stopped the run with a traceback naming no line."""
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n{"prompt": "cut sh')
    stats = PromptStats()
    assert len(list(iter_prompts(dataset(path), stats))) == 1
    assert stats.skipped == [
        (f"{path}:2", "not UTF-8 text (byte 0xe9 at column 16)"),
        (f"{path}:3", stats.skipped[1][1]),
    ]
    assert stats.skipped[1][1].startswith("not valid JSON (Unterminated string")


def test_a_file_with_no_usable_rows_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"nothing": 1}, "[1, 2]"])
    with pytest.raises(ConfigError, match=r"no usable prompt rows \(2 read, 2 skipped\)"):
        load_prompts(dataset(path))


def test_missing_source_names_the_dataset(tmp_path):
    with pytest.raises(ConfigError, match=r"datasets\[d\]\.source: .* does not exist"):
        load_prompts(dataset(tmp_path / "missing.jsonl"))


def test_multi_turn_last_and_all(tmp_path):
    convo = {
        "id": "c",
        "messages": [
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1"},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "a2"},
            {"role": "user", "content": "q3"},
        ],
    }
    path = write_jsonl(tmp_path / "a.jsonl", [convo])
    (last,), _ = load_prompts(dataset(path))
    assert last.prompt_id == "c" and last.messages == convo["messages"]
    turns, _ = load_prompts(dataset(path, multi_turn="all"))
    assert [(p.prompt_id, p.turn, len(p.messages)) for p in turns] == [("c#0", 0, 1), ("c#1", 1, 3), ("c#2", 2, 5)]


def test_parquet_json_and_directory_sources_with_max_prompts(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist([{"prompt": f"p{i}"} for i in range(3)]), folder / "a.parquet")
    (folder / "b.json").write_text(json.dumps([{"instruction": "do x"}, {"instruction": "do y"}]))
    prompts, stats = load_prompts(dataset(folder))
    assert [p.messages[-1]["content"] for p in prompts] == ["p0", "p1", "p2", "do x", "do y"]
    capped, _ = load_prompts(dataset(folder, max_prompts=2))
    assert len(capped) == 2


def test_a_dataset_used_as_it_is_carries_its_own_answers(tmp_path):
    chat = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": [{"type": "text", "text": "See you."}]},
    ]
    rows = [{"id": "c", "messages": chat}, {"id": "open", "messages": chat[:3]}]
    path = write_jsonl(tmp_path / "a.jsonl", rows)
    last, stats = load_prompts(dataset(path, regenerate=False))
    assert [(p.prompt_id, p.messages, p.answer) for p in last] == [("c", chat[:3], chat[3])]
    assert stats.skipped == [(f"{path}:2", stats.skipped[0][1])]
    assert "ends with a user turn, not an assistant answer" in stats.skipped[0][1]

    every, _ = load_prompts(dataset(path, regenerate=False, multi_turn="all"))
    assert (
        [(p.prompt_id, p.turn, p.messages, p.answer) for p in every]
        == [
            ("c#0", 0, chat[:1], chat[1]),
            ("c#1", 1, chat[:3], chat[3]),  # the row's own earlier answer stays in the conversation
            ("open#0", 0, chat[:1], chat[1]),
        ]
    )
