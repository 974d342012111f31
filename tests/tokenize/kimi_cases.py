"""The Kimi-K2.5 cases with golden ids, shared by the test and the golden-file writer.

Each case is a generation record as an API would return it; the golden ids were produced
once by the rebuild on the Kimi-structured tokenizer (cl100k ranks, Kimi regex, Kimi special
ids) and checked by hand against the layout in ``shared/reference/kimi-k2.md``.
"""

from __future__ import annotations

from eyas.records import GenerationRecord, Usage

WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def record(content="", reasoning=None, finish="stop", billed=0, messages=None, **extra) -> GenerationRecord:
    return GenerationRecord(
        id="kimi/1",
        dataset="kimi",
        prompt_id="1",
        messages=messages or [{"role": "user", "content": "Hi"}],
        content=content,
        reasoning=reasoning,
        finish_reason=finish,
        usage=Usage(completion_tokens=billed),
        model="kimi-k2.5",
        provider="test",
        created=0.0,
        **extra,
    )


def tool_call(name: str, arguments: str, call_id: str = "call_abc") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


CASES = {
    "reasoning_and_content": record("Hello! How can I help you today?", "The user greets me. I should reply kindly."),
    "tool_calls": record(
        "",
        "I need the weather.",
        finish="tool_calls",
        tools=WEATHER_TOOLS,
        tool_calls=[tool_call("get_weather", '{"city": "Paris"}'), tool_call("get_weather", '{"city": "Oslo"}', "x")],
        messages=[{"role": "user", "content": "Weather in Paris and Oslo?"}],
    ),
    "literal_special_in_content": record("Type <|im_end|> or <|im_user|> literally.", "Quote the tokens."),
    "cjk_and_emoji": record("你好，世界！🌍🚀 日本語もOK", "用户在打招呼。"),
    "empty_reasoning": record("Sure.", ""),
    "length_truncated_in_reasoning": record("", "Let me count: 1, 2, 3", finish="length"),
    "length_truncated_in_content": record("The answer is", "Easy.", finish="length"),
}
