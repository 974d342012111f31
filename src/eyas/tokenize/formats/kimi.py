"""Kimi-K2.5 and Kimi-K2-Thinking: the prompt and the completion laid out piece by piece.

Layout (``shared/reference/kimi-k2.md``): every turn is ``<|im_{role}|>{name}<|im_middle|>{content}<|im_end|>``
with no newlines between turns; tools are declared in a first ``tool_declare`` system turn
(rendered as JSON, as some servers do; compare the prompt length with ``usage.prompt_tokens``);
K2-Thinking adds its default system turn when the conversation has none (whether K2.5 does is
unverified: ``tokenize.system_prompt`` sets it, and the report's prompt-token match against
``usage.prompt_tokens`` tells which is right); earlier assistant turns keep an empty ``<think></think>`` (historical reasoning is dropped) except
those after the last user turn. K2.5's generation prompt ends with ``<think>``, so its output
starts with reasoning; K2-Thinking's ends at ``<|im_middle|>`` and the model writes ``<think>``.
Completion: reasoning, ``</think>``, content, the tool-call section, ``<|im_end|>``; every seam
is a special token, so no BPE merge crosses them. Tool-call ids are rebuilt as
``functions.{name}:{index}`` with the index counted over the whole conversation.
"""

from __future__ import annotations

import json
import re

from eyas.records import GenerationRecord, Message
from eyas.tokenize.formats.base import Format, Piece, PlanError, text_of, tool_call_parts
from eyas.tokenize.kimi import KIMI_SPECIAL_IDS

SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, ARG_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
TOOL_MARKERS = (SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END)
_WELL_FORMED = re.compile(r"^(S(BAE)+Z)*$")
_MARKER_LETTER = {SECTION_BEGIN: "S", SECTION_END: "Z", CALL_BEGIN: "B", ARG_BEGIN: "A", CALL_END: "E"}
_CHECKED = (
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<think>",
    "</think>",
    *TOOL_MARKERS,
)


class KimiK25(Format):
    name = "kimi-k2.5"
    end_of_turn = "<|im_end|>"
    think_open = "<think>"
    think_close = "</think>"
    thinks = True
    emitted = (*TOOL_MARKERS, "<think>", "</think>")
    expected_ids = {token: KIMI_SPECIAL_IDS[token] for token in _CHECKED}
    separators: dict[tuple[str, str], str] = {}
    """None documented: the reference layout has ``reasoning</think>content`` with nothing between
    (``shared/reference/kimi-k2.md``), so tied whitespace readings keep the order tried."""
    open_think_in_prompt = True
    default_system = ""
    """K2.5's injection of a default system prompt is unverified: none unless configured."""

    def __init__(self, encoder, system_prompt: str | None = None):
        super().__init__(encoder)
        self.system_prompt = self.default_system if system_prompt is None else system_prompt

    def prompts(self, records: list[GenerationRecord]) -> list[list[Piece] | PlanError]:
        out: list[list[Piece] | PlanError] = []
        for r in records:
            try:
                out.append(self.prompt(r))
            except PlanError as e:
                out.append(e)
        return out

    def prompt(self, record: GenerationRecord) -> list[Piece]:
        """K2.5's chat layout, piece by piece: specials by id, every text with parsing off."""
        pieces: list[Piece] = []
        if record.tools:
            pieces += self.turn("im_system", "tool_declare", [json.dumps(record.tools, ensure_ascii=False)])
        first_role = record.messages[0].get("role") if record.messages else None
        if self.system_prompt and first_role not in ("system", "developer"):
            pieces += self.turn("im_system", "system", [self.system_prompt])
        last_user = max((i for i, m in enumerate(record.messages) if m.get("role") == "user"), default=-1)
        calls_so_far = 0
        for i, m in enumerate(record.messages):
            role = m.get("role")
            if role in ("system", "developer"):
                pieces += self.turn("im_system", m.get("name") or "system", [text_of(m.get("content"))])
            elif role == "user":
                pieces += self.turn("im_user", m.get("name") or "user", [text_of(m.get("content"))])
            elif role == "tool":
                body = f"## Return of {m.get('tool_call_id', '')}\n{text_of(m.get('content'))}"
                pieces += self.turn("im_system", m.get("name") or "tool", [body])
            elif role == "assistant":
                reasoning = (m.get("reasoning_content") or m.get("reasoning") or "") if i > last_user else ""
                body = [self.ids["<think>"], *self.text(reasoning, False), self.ids["</think>"]]
                body += self.text(text_of(m.get("content")), False)
                body += self.section(m.get("tool_calls") or [], calls_so_far)
                calls_so_far += len(m.get("tool_calls") or [])
                pieces += self.turn("im_assistant", m.get("name") or "assistant", body)
            else:
                raise PlanError(f"message role {role!r}")
        pieces += [self.ids["<|im_assistant|>"], "assistant", self.ids["<|im_middle|>"]]
        if self.open_think_in_prompt:
            pieces.append(self.ids["<think>"])
        return pieces

    def turn(self, role: str, name: str, body: list[Piece]) -> list[Piece]:
        return [self.ids[f"<|{role}|>"], name, self.ids["<|im_middle|>"], *body, self.ids["<|im_end|>"]]

    def section(self, calls: list[dict], first_index: int) -> list[Piece]:
        """``<|tool_calls_section_begin|>`` … one begin/argument/end triple per call … section end."""
        if not calls:
            return []
        pieces: list[Piece] = [self.ids[SECTION_BEGIN]]
        for k, call in enumerate(calls):
            name, args = tool_call_parts(call)
            pieces += [self.ids[CALL_BEGIN], f"functions.{name}:{first_index + k}", self.ids[ARG_BEGIN]]
            pieces += [args, self.ids[CALL_END]] if args else [self.ids[CALL_END]]
        return pieces + [self.ids[SECTION_END]]

    def tool_calls(self, record: GenerationRecord, content: str) -> list[Piece]:
        return self.section(record.tool_calls or [], _calls_before(record.messages))

    def malformed_markup(self, text: str) -> bool:
        letters = "".join(_MARKER_LETTER[m] for m in re.findall("|".join(map(re.escape, TOOL_MARKERS)), text))
        return _WELL_FORMED.match(letters) is None


class KimiK2Thinking(KimiK25):
    name = "kimi-k2-thinking"
    open_think_in_prompt = False
    default_system = "You are Kimi, an AI assistant created by Moonshot AI."


def _calls_before(messages: list[Message]) -> int:
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
