"""The pure parts of the HTTP backend: error classification, the retry policy, response parsing."""

from __future__ import annotations

import json

import pytest

from eyas.generate.http.errors import Cause, Failure, RequestFailure
from eyas.generate.http.response import StreamAssembler, parse_body
from eyas.generate.http.retry import RetryPolicy, classify_status, parse_retry_after


@pytest.mark.parametrize(
    ("status", "body", "cause"),
    [
        (429, {"error": {"message": "slow down"}}, Cause.RATE_LIMITED),
        (408, None, Cause.SERVER),
        (409, None, Cause.SERVER),
        (425, None, Cause.SERVER),
        (500, None, Cause.SERVER),
        (502, {"error": {"message": "provider down"}}, Cause.SERVER),
        (503, None, Cause.SERVER),
        (504, None, Cause.SERVER),
        (402, {"error": {"message": "in_flight_budget_exhausted"}}, Cause.IN_FLIGHT_BUDGET),
        (402, {"error": {"message": "Insufficient credits"}}, Cause.CREDITS),
        (
            402,
            {"error": {"message": "Key limit exceeded", "metadata": {"error_type": "openrouter_key_limit"}}},
            Cause.CREDITS,
        ),
        (400, {"error": {"message": "bad", "metadata": {"error_type": "context_length_exceeded"}}}, Cause.PROMPT),
        (403, {"error": {"message": "Input was flagged by moderation"}}, Cause.PROMPT),
        (400, {"error": {"message": "unknown parameter foo"}}, Cause.REJECTED),
        (401, {"error": {"message": "No auth credentials found"}}, Cause.REJECTED),
        (404, "not found", Cause.REJECTED),
    ],
)
def test_classify_status(status, body, cause):
    f = classify_status(status, body)
    assert f.cause is cause
    assert f.status == status
    assert f.message.startswith(f"HTTP {status}")


def test_retry_after_seconds_and_http_date():
    assert parse_retry_after("2.5") == 2.5
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("100000") == 600.0
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now=1445412480.0) == pytest.approx(10.0)
    assert classify_status(429, None, "3").retry_after_s == 3.0


def test_backoff_is_full_jitter_under_an_exponential_cap():
    policy = RetryPolicy(max_attempts=10, base_s=1.0, max_s=8.0)
    server = Failure(Cause.SERVER, "x")
    assert [policy.next_delay(a, server, 1.0) for a in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert policy.next_delay(3, server, 0.25) == 1.0
    assert policy.next_delay(3, server, 0.0) == 0.0


def test_retry_after_is_a_floor_and_final_causes_never_retry():
    policy = RetryPolicy(max_attempts=3, base_s=1.0)
    assert policy.next_delay(1, Failure(Cause.RATE_LIMITED, "x", 429, 5.0), 0.5) == 5.0
    assert policy.next_delay(2, Failure(Cause.RATE_LIMITED, "x", 429, 0.1), 1.0) == 2.0
    assert policy.next_delay(3, Failure(Cause.SERVER, "x"), 0.5) is None
    for cause in (Cause.CREDITS, Cause.REJECTED, Cause.PROMPT):
        assert policy.next_delay(1, Failure(cause, "x"), 0.5) is None


def _cause(raw: bytes) -> Cause:
    with pytest.raises(RequestFailure) as e:
        parse_body(raw)
    return e.value.failure.cause


def test_errors_inside_http_200_are_failures():
    assert _cause(b"") is Cause.BAD_RESPONSE
    assert _cause(b'{"choices": [') is Cause.BAD_RESPONSE
    assert _cause(b"[]") is Cause.BAD_RESPONSE
    assert _cause(b'{"choices": []}') is Cause.BAD_RESPONSE
    assert _cause(b'{"error": {"code": 503, "message": "no provider"}}') is Cause.SERVER
    assert _cause(b'{"error": {"code": 402, "message": "Insufficient credits"}}') is Cause.CREDITS
    choice_error = {
        "choices": [
            {"finish_reason": "error", "error": {"code": 429, "message": "x"}, "message": {"content": "partial"}}
        ]
    }
    assert _cause(json.dumps(choice_error).encode()) is Cause.RATE_LIMITED


def test_complete_body_becomes_a_reply():
    body = {
        "id": "gen-1",
        "provider": "Moonshot",
        "choices": [
            {
                "finish_reason": "length",
                "message": {"content": "hi", "reasoning_content": "hmm", "tool_calls": [{"id": "t"}]},
            }
        ],
        "usage": {
            "prompt_tokens": 5,
            "completion_tokens": 7,
            "completion_tokens_details": {"reasoning_tokens": 2},
            "cost": 0.5,
        },
    }
    r = parse_body(json.dumps(body).encode())
    assert (r.content, r.reasoning, r.finish_reason, r.provider, r.generation_id) == (
        "hi",
        "hmm",
        "length",
        "Moonshot",
        "gen-1",
    )
    assert r.tool_calls == [{"id": "t"}]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.reasoning_tokens, r.usage.cost) == (5, 7, 2, 0.5)
    assert r.cost_reported
    assert not parse_body(b'{"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": 1}}').cost_reported


def _feed(lines: list[bytes]) -> StreamAssembler:
    a = StreamAssembler()
    for line in lines:
        a.feed_line(line)
    return a


def _data(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n"


def test_stream_skips_keepalives_and_merges_tool_calls():
    lines = [
        b": OPENROUTER PROCESSING\n",
        b"\n",
        _data({"id": "gen-2", "provider": "P", "choices": [{"delta": {"reasoning": "a"}}]}),
        b": OPENROUTER PROCESSING\n",
        _data({"choices": [{"delta": {"content": "Hel"}}]}),
        _data(
            {
                "choices": [
                    {
                        "delta": {
                            "content": "lo",
                            "tool_calls": [{"index": 0, "id": "c1", "function": {"name": "get", "arguments": '{"a"'}}],
                        }
                    }
                ]
            }
        ),
        _data(
            {
                "choices": [
                    {
                        "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]},
                        "finish_reason": "tool_calls",
                    }
                ]
            }
        ),
        _data({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "cost": 0.1}}),
        b"data: [DONE]\n",
    ]
    a = _feed(lines)
    assert a.done
    r = a.reply()
    assert (r.content, r.reasoning, r.finish_reason, r.generation_id, r.provider) == (
        "Hello",
        "a",
        "tool_calls",
        "gen-2",
        "P",
    )
    assert r.tool_calls == [{"type": "function", "id": "c1", "function": {"name": "get", "arguments": '{"a": 1}'}}]
    assert r.usage.cost == 0.1


def test_stream_errors_mid_stream_truncation_and_bad_chunks():
    with pytest.raises(RequestFailure) as e:
        _feed(
            [
                _data({"choices": [{"delta": {"content": "x"}}]}),
                _data({"error": {"code": 502, "message": "gone"}, "choices": [{"finish_reason": "error"}]}),
            ]
        )
    assert e.value.failure.cause is Cause.SERVER
    with pytest.raises(RequestFailure) as e:
        _feed([b"data: {not json\n"])
    assert e.value.failure.cause is Cause.BAD_RESPONSE
    with pytest.raises(RequestFailure) as e:
        _feed([_data({"choices": [{"delta": {"content": "x"}}]})]).reply()
    assert e.value.failure.cause is Cause.CONNECTION
