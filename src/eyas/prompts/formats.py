"""Turn one raw row into a conversation, whatever format it is in.

Formats: OpenAI ``messages`` (+``tools``), ShareGPT ``conversations`` (``from``/``value``),
a bare ``prompt`` (+ optional ``system``), or ``instruction`` (+ optional ``input``).
A row that cannot be read raises :class:`RowError` with the reason; the caller adds where.
"""

from __future__ import annotations

from typing import Any

from eyas.records import Message

SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
}
ROLES = {"system", "user", "assistant", "tool", "developer"}


class RowError(ValueError):
    """Why a row is not a usable prompt."""


def detect_format(row: dict[str, Any]) -> str:
    if "messages" in row:
        return "messages"
    if "conversations" in row:
        return "sharegpt"
    if "instruction" in row:
        return "instruction"
    if "prompt" in row:
        return "prompt"
    raise RowError(f"no known prompt field (messages, conversations, prompt, instruction); keys: {sorted(row)}")


def row_messages(row: Any, fmt: str = "auto") -> tuple[list[Message], list[dict[str, Any]] | None]:
    """The row's conversation in OpenAI form, and its tools if it declares any."""
    if not isinstance(row, dict):
        raise RowError(f"expected an object, got {type(row).__name__}")
    if fmt == "auto":
        fmt = detect_format(row)
    if fmt == "messages":
        messages = _openai_messages(row.get("messages"))
    elif fmt == "sharegpt":
        messages = _sharegpt_messages(row.get("conversations"))
    elif fmt == "prompt":
        messages = _text_prompt(row, "prompt", row.get("system"))
    else:
        messages = _instruction(row)
    tools = row.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise RowError("'tools' must be a list of objects")
    return messages, tools or None


def _openai_messages(raw: Any) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise RowError("'messages' must be a non-empty list")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise RowError(f"messages[{i}] is not an object")
        role = m.get("role")
        if role not in ROLES:
            raise RowError(f"messages[{i}].role is {role!r}, not one of {sorted(ROLES)}")
        content = m.get("content")
        if content is None and not m.get("tool_calls"):
            raise RowError(f"messages[{i}] has no content")
        if content is not None and not isinstance(content, (str, list)):
            raise RowError(f"messages[{i}].content must be a string or a list of parts")
        messages.append({k: v for k, v in m.items() if v is not None})
    return messages


def _sharegpt_messages(raw: Any) -> list[Message]:
    if not isinstance(raw, list) or not raw:
        raise RowError("'conversations' must be a non-empty list")
    messages = []
    for i, turn in enumerate(raw):
        if not isinstance(turn, dict):
            raise RowError(f"conversations[{i}] is not an object")
        speaker = turn.get("from", turn.get("role"))
        role = SHAREGPT_ROLES.get(str(speaker).lower())
        if role is None:
            raise RowError(f"conversations[{i}].from is {speaker!r}, not a known speaker")
        value = turn.get("value", turn.get("content"))
        if not isinstance(value, str):
            raise RowError(f"conversations[{i}].value must be a string")
        messages.append({"role": role, "content": value})
    return messages


def _text_prompt(row: dict[str, Any], key: str, system: Any) -> list[Message]:
    text = row.get(key)
    if not isinstance(text, str) or not text.strip():
        raise RowError(f"'{key}' must be a non-empty string")
    messages: list[Message] = []
    if isinstance(system, str) and system.strip():
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": text})
    return messages


def _instruction(row: dict[str, Any]) -> list[Message]:
    instruction = row.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise RowError("'instruction' must be a non-empty string")
    extra = row.get("input")
    text = f"{instruction}\n\n{extra}" if isinstance(extra, str) and extra.strip() else instruction
    return _text_prompt({"prompt": text}, "prompt", row.get("system"))
