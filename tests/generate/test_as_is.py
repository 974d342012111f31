"""Datasets used as they are beside a regenerated one: records without a target call, then the
usual tokenize on the real embedded tokenizer, ids equal to the chat template's own rendering."""

import pyarrow.parquet as pq
import yaml

from eyas import generate, tokenize
from eyas.config import load_config
from eyas.generate.store import read_records
from eyas.paths import RunPaths
from tests.conftest import write_jsonl

CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": "And an even one?"},
    {"role": "assistant", "content": "2, the only even prime."},
]
LOGS = [
    {"id": "log-1", "messages": CHAT},
    {"id": "log-2", "conversations": [{"from": "human", "value": "Say hi."}, {"from": "gpt", "value": "Hi!"}]},
]


def write_config(tmp_path, datasets, backend="openai"):
    data = {
        "run_dir": "run",
        "target": {"model": "embedded", "device": "cpu"},
        "datasets": datasets,
        "generate": {"backend": backend, "max_tokens": 6, "batch_size": 2},
    }
    if backend == "openai":  # a port nothing listens on, and no key: the run fails if it calls out
        data["generate"]["http"] = {
            "base_url": "http://127.0.0.1:9/v1",
            "model": "m",
            "api_key_env": "EYAS_NO_SUCH_KEY",
        }
    data = {
        **data,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def test_as_is_answers_need_no_target_and_no_api_key(tmp_path):
    write_jsonl(tmp_path / "logs.jsonl", LOGS)
    config = write_config(tmp_path, [{"name": "logs", "source": "logs.jsonl", "regenerate": False}])
    generate.run(config, quiet=True)
    records = {r.id: r for r in read_records(RunPaths.of(config).generations("logs"))}
    assert set(records) == {"logs/log-1", "logs/log-2"}
    assert records["logs/log-1"].content == CHAT[-1]["content"] and records["logs/log-1"].messages == CHAT[:-1]
    assert {r.provider for r in records.values()} == {"dataset"}
    before = RunPaths.of(config).generations("logs").read_bytes()
    generate.run(config, quiet=True)
    assert RunPaths.of(config).generations("logs").read_bytes() == before


def test_as_is_and_regenerated_datasets_mix_and_tokenize_to_the_templates_ids(tmp_path, tokenizer):
    write_jsonl(tmp_path / "logs.jsonl", LOGS)
    write_jsonl(tmp_path / "asks.jsonl", [{"prompt": "Count to three."}])
    config = write_config(
        tmp_path,
        [
            {"name": "logs", "source": "logs.jsonl", "regenerate": False, "multi_turn": "all"},
            {"name": "asks", "source": "asks.jsonl"},
        ],
        backend="local",
    )
    generate.run(config, quiet=True)
    paths = RunPaths.of(config)
    assert [r.provider for r in read_records(paths.generations("asks"))] == ["local"]
    report = tokenize.run(config, quiet=True, verify_ids=True)
    assert report["datasets"]["asks"]["verified_exact"] == 1
    rows = pq.read_table(paths.tokenized("logs")).to_pylist()
    say_hi = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]
    expected_conversations = {"logs/log-1#0": CHAT[:3], "logs/log-1#1": CHAT, "logs/log-2#0": say_hi}
    assert sorted(r["id"] for r in rows) == sorted(expected_conversations)
    for row in rows:
        conversation = expected_conversations[row["id"]]
        rendered = tokenizer.encode(
            tokenizer.apply_chat_template(conversation, tokenize=False), add_special_tokens=False
        )
        assert row["input_ids"] == rendered[: len(row["input_ids"])]
        assert len(rendered) - len(row["input_ids"]) <= 1  # the template's newline after the last turn
        answer = tokenizer.decode([i for i, m in zip(row["input_ids"], row["loss_mask"]) if m])
        assert answer == conversation[-1]["content"] + "<|im_end|>"
