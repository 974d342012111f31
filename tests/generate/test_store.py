import pytest

from eyas.generate.store import RecordWriter, conversation_for, make_record, save_settings, scan, settings_changes
from eyas.jsonl import DurableAppender, JsonlError, read_jsonl, recover
from eyas.records import PromptRecord, Usage


def test_torn_last_line_is_dropped_and_reported(tmp_path, caplog):
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3, "b": "cut sho')
    assert recover(path) == len('{"a": 3, "b": "cut sho')
    assert [obj["a"] for _, obj in read_jsonl(path)] == [1, 2]
    assert "dropped a torn last line" in caplog.text
    assert recover(path) == 0


def test_complete_last_line_without_newline_is_not_trusted(tmp_path):
    # A whole JSON object with no newline may still be torn mid-record for a longer writer; the newline marks completion.
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}')
    recover(path)
    assert path.read_text() == '{"a": 1}\n'


def test_appender_recovers_before_appending(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n{"a": 2')
    with DurableAppender(path) as out:
        out.write_json({"a": 3})
    assert [obj["a"] for _, obj in read_jsonl(path)] == [1, 3]


def test_bad_line_in_the_middle_names_file_and_line(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\nnope\n{"a": 2}\n')
    with pytest.raises(JsonlError, match=rf"{path}:2: not valid JSON"):
        list(read_jsonl(path))


def prompt(pid, messages, turn=None):
    return PromptRecord(pid, "d", messages, turn=turn)


def test_writer_skips_ids_already_written_and_scan_counts(tmp_path):
    path = tmp_path / "d.jsonl"
    p = prompt("x", [{"role": "user", "content": "hi"}])
    record = make_record(
        p, p.messages, content="yo", finish_reason="stop", model="m", provider="local", usage=Usage(3, 2)
    )
    with RecordWriter(path, scan(path)) as w:
        w.write(record)
        w.write(record)
    state = scan(path)
    assert state.done == {"d/x"} and state.completion_tokens == 2 and state.finish_reasons == {"stop": 1}
    assert len(path.read_text().splitlines()) == 1


def test_later_turns_carry_the_models_own_earlier_answers(tmp_path):
    path = tmp_path / "d.jsonl"
    convo = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "original"},
        {"role": "user", "content": "q2"},
    ]
    turn1 = prompt("c#1", convo, turn=1)
    state = scan(path)
    assert conversation_for(turn1, state) is None
    first = prompt("c#0", convo[:1], turn=0)
    with RecordWriter(path, state) as w:
        w.write(
            make_record(first, first.messages, content="regenerated", finish_reason="stop", model="m", provider="local")
        )
    assert conversation_for(turn1, scan(path))[1] == {"role": "assistant", "content": "regenerated"}


def test_settings_changes_name_each_changed_sampling_setting(tmp_path):
    path = tmp_path / "settings.json"
    assert settings_changes(path, {"temperature": 0.0, "max_tokens": 16}) == {}
    save_settings(path, {"temperature": 0.0, "max_tokens": 16})
    assert settings_changes(path, {"temperature": 0.0, "max_tokens": 16}) == {}
    assert settings_changes(path, {"temperature": 0.7, "max_tokens": 16}) == {"temperature": (0.0, 0.7)}


def test_settings_changes_notice_a_setting_that_was_dropped(tmp_path):
    path = tmp_path / "settings.json"
    save_settings(path, {"temperature": 0.0, "extra_body": {"top_k": 5}})
    assert settings_changes(path, {"temperature": 0.0}) == {"extra_body": ({"top_k": 5}, None)}
