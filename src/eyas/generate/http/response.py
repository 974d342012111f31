"""Turn an OpenAI-compatible chat response, whole or streamed, into one :class:`Reply`.

An HTTP 200 is not proof of a result: OpenRouter reports provider failures inside it
(``choices[].finish_reason == "error"``, a top-level ``error``, or a mid-stream error
chunk), and a truncated body or stream is a failure too. All of those raise
:class:`RequestFailure`, so only a complete answer ever becomes a record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from eyas.generate.http.errors import Cause, Failure, RequestFailure
from eyas.generate.http.retry import classify_status, error_text
from eyas.records import Usage


@dataclass
class Reply:
    content: str
    finish_reason: str
    usage: Usage
    cost_reported: bool
    """Whether the server sent `usage.cost` (OpenRouter does; local servers do not)."""
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    provider: str | None = None
    generation_id: str | None = None


def bad_response(message: str) -> RequestFailure:
    return RequestFailure(Failure(Cause.BAD_RESPONSE, message))


def _error_failure(error: Any, where: str) -> RequestFailure:
    """An error object found inside a 200: classified by its code when it has one."""
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, int) and 400 <= code < 600:
        f = classify_status(code, {"error": error})
        return RequestFailure(Failure(f.cause, f"{where}: {f.message}", code, f.retry_after_s))
    message, kind = error_text({"error": error})
    return bad_response(f"{where}: {message or 'error'}" + (f" ({kind})" if kind else ""))


def usage_of(data: Any) -> tuple[Usage, bool]:
    if not isinstance(data, dict):
        return Usage(), False
    details = data.get("completion_tokens_details") or {}
    cost = data.get("cost")
    return (
        Usage(
            prompt_tokens=int(data.get("prompt_tokens") or 0),
            completion_tokens=int(data.get("completion_tokens") or 0),
            reasoning_tokens=int(details.get("reasoning_tokens") or 0),
            cost=float(cost or 0.0),
        ),
        cost is not None,
    )


def parse_body(raw: bytes) -> Reply:
    """A non-streamed response body."""
    if not raw.strip():
        raise bad_response("HTTP 200 with an empty body")
    try:
        data = json.loads(raw)
    except ValueError:
        raise bad_response(f"HTTP 200 with malformed JSON ({raw[:80]!r})") from None
    if not isinstance(data, dict):
        raise bad_response(f"HTTP 200 with a JSON {type(data).__name__}, not an object")
    if data.get("error"):
        raise _error_failure(data["error"], "error in HTTP 200 body")
    choices = data.get("choices")
    if not choices or not isinstance(choices[0], dict):
        raise bad_response("HTTP 200 without choices")
    choice = choices[0]
    if choice.get("finish_reason") == "error" or choice.get("error"):
        raise _error_failure(choice.get("error") or {}, "choice finished with an error")
    message = choice.get("message") or {}
    usage, has_cost = usage_of(data.get("usage"))
    return Reply(
        content=message.get("content") or "",
        finish_reason=choice.get("finish_reason") or "stop",
        usage=usage,
        cost_reported=has_cost,
        reasoning=message.get("reasoning") or message.get("reasoning_content"),
        tool_calls=message.get("tool_calls") or None,
        provider=data.get("provider"),
        generation_id=data.get("id"),
    )


@dataclass
class StreamAssembler:
    """Accumulates SSE ``data:`` chunks into a Reply; comment lines (keep-alives) are skipped."""

    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: Any = None
    provider: str | None = None
    generation_id: str | None = None
    done: bool = False

    def feed_line(self, line: bytes) -> None:
        line = line.strip()
        if not line or line.startswith(b":"):
            return  # blank separator or a keep-alive comment such as `: OPENROUTER PROCESSING`
        if not line.startswith(b"data:"):
            return  # `event:`/`id:`/`retry:` fields carry nothing we use
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            raise bad_response(f"malformed JSON in stream chunk ({payload[:80]!r})") from None
        self.feed_chunk(chunk)

    def feed_chunk(self, chunk: dict[str, Any]) -> None:
        if chunk.get("error"):
            raise _error_failure(chunk["error"], "error in the middle of the stream")
        self.generation_id = self.generation_id or chunk.get("id")
        self.provider = self.provider or chunk.get("provider")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("finish_reason") == "error" or choice.get("error"):
                raise _error_failure(choice.get("error") or {}, "error in the middle of the stream")
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
            piece = delta.get("reasoning") or delta.get("reasoning_content")
            if piece:
                self.reasoning.append(piece)
            for call in delta.get("tool_calls") or ():
                self._merge_tool_call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _merge_tool_call(self, call: dict[str, Any]) -> None:
        slot = self.tool_calls.setdefault(
            call.get("index", len(self.tool_calls)), {"type": "function", "function": {"name": "", "arguments": ""}}
        )
        if call.get("id"):
            slot["id"] = call["id"]
        fn = call.get("function") or {}
        slot["function"]["name"] += fn.get("name") or ""
        slot["function"]["arguments"] += fn.get("arguments") or ""

    def reply(self) -> Reply:
        if self.finish_reason is None:
            raise RequestFailure(Failure(Cause.CONNECTION, "the stream ended before a finish_reason"))
        usage, has_cost = usage_of(self.usage)
        return Reply(
            content="".join(self.content),
            finish_reason=self.finish_reason,
            usage=usage,
            cost_reported=has_cost,
            reasoning="".join(self.reasoning) or None,
            tool_calls=[self.tool_calls[i] for i in sorted(self.tool_calls)] or None,
            provider=self.provider,
            generation_id=self.generation_id,
        )
