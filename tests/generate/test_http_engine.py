"""The HTTP backend end to end against a fake OpenRouter on 127.0.0.1, run in-process.

Each prompt's fate is scripted by the fake server's directives, so the outcomes are exact:
which prompts become records (once each), which end in the errors file and why, what was
charged, and what the ledger says.
"""

from __future__ import annotations

import json
import socket

import pytest

from eyas import generate
from eyas.config import parse_config
from eyas.generate.http.budget import replay
from eyas.generate.http.errors import BudgetReached, CreditsExhausted, RequestRejected
from eyas.stage import StageError
from tests.conftest import write_jsonl
from tests.generate.configs import openai_generate
from tests.generate.fake_openai import FakeOpenAI, FakeServer

FAILURES = [
    "[[429x2]] a",
    "[[500]] b",
    "[[502]] b2",
    "[[503]] b3",
    "[[reset]] c",
    "[[err200]] d",
    "[[toperr]] e",
    "[[empty]] f",
    "[[malformed]] g",
    "[[inflight]] h",
    "[[length]] i",
    "[[ctx]] j",
    "[[always500]] k",
    "[[midstream]] l",
]


CONVERSATION = {
    "id": "c",
    "messages": [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "old answer"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "old answer 2"},
    ],
}
"""Two turns to regenerate with ``multi_turn: all``: the second must read the model's first answer."""


def make_config(tmp_path, base_url, prompts, **generate_overrides):
    source = write_jsonl(tmp_path / "prompts.jsonl", [{"id": f"p{i}", "prompt": p} for i, p in enumerate(prompts)])
    datasets = generate_overrides.pop("datasets", None) or [{"name": "ds", "source": str(source)}]
    g = openai_generate(base_url, **generate_overrides)
    return parse_config({"run_dir": str(tmp_path / "run"), "datasets": datasets, "generate": g})


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def check_exactly_once(records: list[dict], fake: FakeOpenAI) -> None:
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids))
    served = {r["messages"][-1]["content"] for r in records}
    assert {p: n for p, n in fake.served.items()} == {p: 1 for p in served}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_every_failure_ends_in_one_record_or_one_error_line(tmp_path, stream):
    prompts = ["plain one", "plain two", *FAILURES, "[[huge]] m", "[[noid]] n"]
    fake = FakeOpenAI(latency_s=0.01, keepalives=3)
    with FakeServer(fake) as server:
        config = make_config(
            tmp_path,
            server.base_url,
            prompts,
            stream=stream,
            reasoning={"effort": "high"},
            extra_body={"chat_template_kwargs": {"thinking": True}},
            provider_policy={"quantizations": ["int4", "fp8"]},
        )
        generate.run(config, quiet=True)
        run = tmp_path / "run" / "generate"
        records = lines(run / "ds.jsonl")
        errors = lines(run / "ds.errors.jsonl")
        assert sorted(r["prompt_id"] for r in records) == sorted(
            f"p{i}" for i, p in enumerate(prompts) if "ctx" not in p and "always500" not in p
        )
        check_exactly_once(records, fake)
        by_prompt = {r["messages"][-1]["content"]: r for r in records}
        assert (
            len(by_prompt.pop("[[huge]] m")["content"]) > 600_000
        )  # one SSE line longer than aiohttp's readline allows (512 KiB)
        for p, r in by_prompt.items():
            assert r["content"] == f"answer to: {p}"
            assert r["reasoning"] == "let me think"
            assert r["provider"] == "FakeAI" and r["generation_id"].startswith("gen-")
            assert "token_ids" not in r
        assert by_prompt["[[429x2]] a"]["attempts"] == 3
        assert by_prompt["plain one"]["attempts"] == 1
        assert by_prompt["[[length]] i"]["finish_reason"] == "length"
        assert [
            (e["prompt_id"], e["cause"], e["status"], e["attempts"])
            for e in sorted(errors, key=lambda e: e["prompt_id"])
        ] == [("p13", "prompt", 400, 1), ("p14", "server", 500, 3)]
        assert "maximum context length" in errors[0]["message"] + errors[1]["message"]

        body = fake.bodies[0]
        assert body["provider"] == {"quantizations": ["int4", "fp8"]}
        assert body["reasoning"] == {"effort": "high"}
        assert body["chat_template_kwargs"] == {"thinking": True}
        assert (body["max_tokens"], body["seed"], body.get("stream", False)) == (64, 0, stream)

        spending, open_reservations = replay(run / "ledger.jsonl")
        assert spending.spent == pytest.approx(sum(r["usage"]["cost"] for r in records)) == pytest.approx(fake.charged)
        assert spending.possibly_spent == 0.0 and not open_reservations

        # The rerun retries only the two failures; they fail again and are listed once each.
        generate.run(config, quiet=True)
        assert len(lines(run / "ds.jsonl")) == len(records)
        assert sorted(e["prompt_id"] for e in lines(run / "ds.errors.jsonl")) == ["p13", "p14"]
        check_exactly_once(lines(run / "ds.jsonl"), fake)


def test_budget_caps_spend_and_a_bigger_budget_resumes(tmp_path):
    prompts = [f"question number {i}" for i in range(30)]
    fake = FakeOpenAI(latency_s=0.01)
    with FakeServer(fake) as server:
        # Prices come from the endpoints listing, over the endpoints the policy allows (FakeAI: $1/$4 per M).
        policy = {"quantizations": ["int4"]}
        config = make_config(
            tmp_path, server.base_url, prompts, budget_usd=0.0008, provider_policy=policy, max_tokens=100
        )
        with pytest.raises(BudgetReached):
            generate.run(config, quiet=True)
        records = lines(tmp_path / "run" / "generate" / "ds.jsonl")
        ledger, _ = replay(tmp_path / "run" / "generate" / "ledger.jsonl")
        assert 0 < len(records) < 30
        assert ledger.spent <= 0.0008 and fake.charged <= 0.0008
        assert ledger.spent == pytest.approx(fake.charged)
        check_exactly_once(records, fake)

        generate.run(
            make_config(tmp_path, server.base_url, prompts, budget_usd=1.0, provider_policy=policy, max_tokens=100),
            quiet=True,
        )
        records = lines(tmp_path / "run" / "generate" / "ds.jsonl")
        assert len(records) == 30
        check_exactly_once(records, fake)


def test_credits_running_out_stops_cleanly_and_resumes(tmp_path):
    prompts = [f"credit question {i}" for i in range(24)]
    fake = FakeOpenAI(latency_s=0.01, credits_usd=0.0004)
    with FakeServer(fake) as server:
        config = make_config(tmp_path, server.base_url, prompts, concurrency=3)
        with pytest.raises(CreditsExhausted):
            generate.run(config, quiet=True)
        records = lines(tmp_path / "run" / "generate" / "ds.jsonl")
        assert 0 < len(records) < 24
        check_exactly_once(records, fake)  # every answer the server billed was saved
        assert not (tmp_path / "run" / "generate" / "ds.errors.jsonl").read_text()

        fake.credits_usd = None
        generate.run(config, quiet=True)
        records = lines(tmp_path / "run" / "generate" / "ds.jsonl")
        assert len(records) == 24
        check_exactly_once(records, fake)


def test_output_token_target_stops_launching(tmp_path):
    prompts = [f"target question {i}" for i in range(40)]
    fake = FakeOpenAI(latency_s=0.01)
    with FakeServer(fake) as server:
        config = make_config(tmp_path, server.base_url, prompts, concurrency=2)
        config.datasets[0].output_token_target = 50
        generate.run(config, quiet=True)
    records = lines(tmp_path / "run" / "generate" / "ds.jsonl")
    tokens = sum(r["usage"]["completion_tokens"] for r in records)
    per_answer = max(r["usage"]["completion_tokens"] for r in records)
    assert 50 <= tokens < 50 + 2 * per_answer
    assert len(records) < 40


def test_multi_turn_conversations_use_the_models_own_earlier_answers(tmp_path):
    source = write_jsonl(tmp_path / "conv.jsonl", [CONVERSATION])
    fake = FakeOpenAI()
    with FakeServer(fake) as server:
        config = make_config(
            tmp_path, server.base_url, ["unused"], datasets=[{"name": "mt", "source": str(source), "multi_turn": "all"}]
        )
        generate.run(config, quiet=True)
    records = {r["prompt_id"]: r for r in lines(tmp_path / "run" / "generate" / "mt.jsonl")}
    assert set(records) == {"c#0", "c#1"}
    assert records["c#1"]["messages"][1] == {"role": "assistant", "content": "answer to: first"}


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_many_servers_route_around_a_dead_one(tmp_path):
    prompts = [f"spread question {i}" for i in range(20)]
    fake = FakeOpenAI(latency_s=0.01)
    with FakeServer(fake) as server:
        config = make_config(
            tmp_path, None, prompts, base_urls=[_dead_url(), server.base_url], retry={"max_attempts": 8}
        )
        generate.run(config, quiet=True)
    records = lines(tmp_path / "run" / "generate" / "ds.jsonl")
    assert len(records) == 20
    check_exactly_once(records, fake)


def test_a_rejected_key_fails_fast_without_printing_it(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("FAKE_KEY", "sk-secret-123")
    fake = FakeOpenAI(api_key="sk-other")
    with FakeServer(fake) as server:
        config = make_config(
            tmp_path, server.base_url, [f"q{i}" for i in range(10)], api_key_env="FAKE_KEY", retry={"max_attempts": 8}
        )
        with pytest.raises(RequestRejected) as e:
            generate.run(config, quiet=True)
    assert "401" in str(e.value) and "sk-secret-123" not in str(e.value)
    assert "sk-secret-123" not in caplog.text
    assert sum(fake.attempts.values()) <= 4  # only what was in flight when the first 401 came back
    assert not lines(tmp_path / "run" / "generate" / "ds.jsonl")


def test_keepalives_hold_a_slow_stream_open_while_silence_times_out(tmp_path):
    fake = FakeOpenAI(latency_s=0.9, keepalives=6)  # 0.9 s to answer: a keep-alive every 0.15 s when streaming
    with FakeServer(fake) as server:
        streamed = make_config(tmp_path / "sse", server.base_url, ["slow one"], stream=True, timeouts={"read_s": 0.5})
        generate.run(streamed, quiet=True)
        silent = make_config(
            tmp_path / "json", server.base_url, ["slow two"], timeouts={"read_s": 0.5}, retry={"max_attempts": 2}
        )
        generate.run(silent, quiet=True)
    assert [r["content"] for r in lines(tmp_path / "sse" / "run" / "generate" / "ds.jsonl")] == ["answer to: slow one"]
    assert not lines(tmp_path / "json" / "run" / "generate" / "ds.jsonl")
    [error] = lines(tmp_path / "json" / "run" / "generate" / "ds.errors.jsonl")
    assert (error["cause"], error["attempts"]) == ("timeout", 2)


def test_a_second_run_on_the_same_run_dir_is_refused(tmp_path):
    import fcntl

    config = make_config(tmp_path, "http://127.0.0.1:9/v1", ["q"])
    lock = tmp_path / "run" / "generate" / ".lock"
    lock.parent.mkdir(parents=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(StageError, match="another eyas generate is running"):
            generate.run(config, quiet=True)


def test_a_dataset_waiting_on_its_target_does_not_hold_up_the_next(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"prompt": f"first set {i}"} for i in range(5)])
    b = write_jsonl(tmp_path / "b.jsonl", [{"prompt": f"second set {i}"} for i in range(3)])
    fake = FakeOpenAI(latency_s=0.6)
    with FakeServer(fake) as server:
        # One request in flight may reach a's target (1 token): a waits for it, b goes ahead meanwhile.
        config = make_config(
            tmp_path,
            server.base_url,
            ["unused"],
            concurrency=2,
            datasets=[{"name": "a", "source": str(a), "output_token_target": 1}, {"name": "b", "source": str(b)}],
        )
        generate.run(config, quiet=True)
    sent = [body["messages"][-1]["content"] for body in fake.bodies]
    # Both go out at once on two connections, so either may reach the server first.
    assert sorted(sent[:2]) == ["first set 0", "second set 0"]
    assert fake.arrivals[1] - fake.arrivals[0] < 0.3  # b did not wait for a's answer (0.6 s)
    assert len(lines(tmp_path / "run" / "generate" / "a.jsonl")) == 1
    assert len(lines(tmp_path / "run" / "generate" / "b.jsonl")) == 3


def test_tools_and_sampling_settings_reach_the_server(tmp_path):
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
    source = write_jsonl(
        tmp_path / "tools.jsonl", [{"messages": [{"role": "user", "content": "what time is it"}], "tools": tools}]
    )
    fake = FakeOpenAI()
    with FakeServer(fake) as server:
        config = make_config(
            tmp_path,
            server.base_url,
            ["unused"],
            temperature=0.7,
            top_p=0.9,
            seed=5,
            stop=["###"],
            datasets=[{"name": "t", "source": str(source)}],
        )
        generate.run(config, quiet=True)
    [body] = fake.bodies
    assert body["tools"] == tools
    assert (body["temperature"], body["top_p"], body["seed"], body["stop"], body["model"]) == (
        0.7,
        0.9,
        5,
        ["###"],
        "fake/model",
    )
    [record] = lines(tmp_path / "run" / "generate" / "t.jsonl")
    assert record["tools"] == tools and record["content"] == "answer to: what time is it"


def test_several_answers_to_a_conversation_each_keep_their_own_turns_and_seed(tmp_path):
    """``generate.samples_per_prompt`` over HTTP: each answer is a request of its own with its own
    seed (one seed for identical requests would buy one answer k times from a seeded server), and
    each answer's later turn continues that answer's conversation."""
    source = write_jsonl(tmp_path / "conv.jsonl", [CONVERSATION])
    fake = FakeOpenAI()
    with FakeServer(fake) as server:
        config = make_config(
            tmp_path,
            server.base_url,
            ["unused"],
            temperature=0.7,
            seed=5,
            samples_per_prompt=2,
            datasets=[{"name": "mt", "source": str(source), "multi_turn": "all"}],
        )
        generate.run(config, quiet=True)
    records = {r["prompt_id"]: r for r in lines(tmp_path / "run" / "generate" / "mt.jsonl")}
    assert set(records) == {"c#0", "c~1#0", "c#1", "c~1#1"}
    for sample in ("c", "c~1"):
        assert records[f"{sample}#1"]["messages"][1] == {
            "role": "assistant",
            "content": records[f"{sample}#0"]["content"],
        }
    seeds = sorted((len(b["messages"]), b["seed"]) for b in fake.bodies)
    assert seeds == [(1, 5), (1, 6), (3, 5), (3, 6)]
