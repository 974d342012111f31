"""What every output format shares: pieces, the completion skeleton, marker handling.

A sample is a list of *pieces*: ``str`` is model-written text, encoded with special-token
parsing off; :class:`Markup` is template text, encoded with parsing on; ``int`` is a special
token inserted by id. A format says how the prompt is rendered and how one assistant answer
is laid out in the model's own output grammar; :mod:`eyas.tokenize.rebuild` does the encoding.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from eyas.config import ConfigError
from eyas.records import GenerationRecord
from eyas.tokenize.encoders import PlanError


class Markup(str):
    """Template text: special-token strings inside it are parsed to their ids."""


Piece = str | int

ENDS_TURN = ("stop", "tool_calls")
"""Finish reasons after which the model emitted its end-of-turn token (not `length`)."""


def text_of(content: Any) -> str:
    """Message content as text: OpenAI multi-part content is joined from its text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    raise PlanError(f"message content of type {type(content).__name__}")


def tool_call_parts(call: dict) -> tuple[str, str]:
    """(name, arguments JSON string) of an OpenAI tool call."""
    fn = call.get("function") or {}
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise PlanError("a tool call without function.name")
    args = fn.get("arguments", "")
    return name, args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)


class Format:
    """An output grammar. Subclasses set the class attributes and override the hooks."""

    name = "base"
    end_of_turn = "<|im_end|>"
    think_open: str | None = None
    think_close: str | None = None
    thinks = False
    """Whether the model always writes reasoning (its absence is reported)."""
    emitted: tuple[str, ...] = ()
    """Special strings the model itself may emit inside text (servers return them raw)."""
    expected_ids: dict[str, int] = {}
    """Special ids the tokenizer must give; anything else is an error at start."""
    separators: dict[tuple[str, str], str] = {}
    """Whitespace the model writes at a reasoning/content edge (``("content", "lead")`` is just after
    ``</think>``) that the layout leaves to the returned text, so a server that strips loses it.
    Billing counts tokens, not where they go: when restorations at different edges match it
    equally, the one restoring these wins. Empty where the format documents none (ChatML and
    Llama 3 models write none around the answer); then the first tried wins."""

    def __init__(self, encoder: Any):
        self.encoder = encoder
        self.ids: dict[str, int] = {}
        for token in (self.end_of_turn, self.think_open, self.think_close, *self.emitted, *self.expected_ids):
            if token is not None:
                tid = encoder.token_id(token)
                if tid is not None:
                    self.ids[token] = tid
        for token, want in self.expected_ids.items():
            if self.ids.get(token) != want:
                raise ConfigError(
                    f"tokenize.format {self.name}: the tokenizer gives {token} id {self.ids.get(token)}, "
                    f"the format expects {want} (wrong tokenizer, or a conversion that shifted special ids)"
                )
        if self.end_of_turn not in self.ids:
            raise ConfigError(f"tokenize.format {self.name}: the tokenizer has no {self.end_of_turn} token")
        added = sorted(encoder.added_tokens, key=len, reverse=True)
        self.added_pattern = re.compile("(" + "|".join(map(re.escape, added)) + ")") if added else None
        present = [m for m in self.emitted if m in self.ids]
        self._markers = (
            re.compile("|".join(map(re.escape, sorted(present, key=len, reverse=True)))) if present else None
        )

    @property
    def end_of_turn_id(self) -> int:
        return self.ids[self.end_of_turn]

    def marker(self, token: str) -> Piece:
        """A grammar marker: its id when the vocabulary has it as one token, else its text."""
        tid = self.ids.get(token)
        if tid is None:
            tid = self.encoder.token_id(token)
        return tid if tid is not None else token

    def template_text(self, text: str) -> list[Piece]:
        """Template-written text inside a completion: added tokens as ids, the rest as plain text,
        so it joins the model text next to it exactly as the tokenizer would see the stream."""
        if self.added_pattern is None:
            return [text]
        parts = self.added_pattern.split(text)
        return [self.encoder.token_id(p) if i % 2 else p for i, p in enumerate(parts)]

    def has_markers(self, text: str) -> bool:
        return self._markers is not None and self._markers.search(text) is not None

    def text(self, text: str, markers_as_specials: bool = True) -> list[Piece]:
        """Model-written text; the format's emitted markers inside it become ids unless told otherwise."""
        if not markers_as_specials or not self.has_markers(text):
            return [text] if text else []
        pieces: list[Piece] = []
        last = 0
        for m in self._markers.finditer(text):
            if m.start() > last:
                pieces.append(text[last : m.start()])
            pieces.append(self.ids[m.group()])
            last = m.end()
        if last < len(text):
            pieces.append(text[last:])
        return pieces

    def prompts(self, records: list[GenerationRecord]) -> list[list[Piece] | PlanError]:
        """Each record's prompt with the generation prompt, rendered by the target's chat template.

        Runs of records with the same tools go to the template in one call (cheaper per sample);
        a run the template rejects is redone record by record so only the bad ones fail.
        """
        out: list[list[Piece] | PlanError] = []
        for _, run in itertools.groupby(records, key=lambda r: json.dumps(r.tools, sort_keys=True)):
            run = list(run)
            try:
                texts = self.encoder.render_chats([r.messages for r in run], run[0].tools)
                out += [[Markup(t)] for t in texts]
            except PlanError:
                out += [self._one_prompt(r) for r in run]
        return out

    def _one_prompt(self, record: GenerationRecord) -> list[Piece] | PlanError:
        try:
            return [Markup(self.encoder.render_chats([record.messages], record.tools)[0])]
        except PlanError as e:
            return e

    def completion(
        self, record: GenerationRecord, prompt_end: str, reasoning: str, content: str, markers_as_specials: bool = True
    ) -> list[Piece]:
        """The answer as the model emitted it: body, then end of turn when the turn ended."""
        pieces = self.body(record, prompt_end, reasoning, content, markers_as_specials)
        if record.finish_reason in ENDS_TURN:
            pieces.append(self.end_of_turn_id)
        return pieces

    def body(
        self, record: GenerationRecord, prompt_end: str, reasoning: str, content: str, markers_as_specials: bool
    ) -> list[Piece]:
        """Reasoning block (if any), content and tool calls; ``prompt_end`` is the prompt's tail text."""
        reasoning, content = self.raw_reasoning(reasoning, content, markers_as_specials)
        pieces = self.reasoning_block(record, prompt_end, reasoning, content)
        pieces += self.text(content, markers_as_specials)
        pieces += self.tool_calls(record, content)
        return pieces

    def raw_reasoning(self, reasoning: str, content: str, markers_as_specials: bool) -> tuple[str, str]:
        """Without a reasoning parser a server returns ``reasoning</think>answer`` as content: split it."""
        close = self.think_close
        if reasoning or not markers_as_specials or close not in self.ids or close not in content:
            return reasoning, content
        head, tail = content.split(close, 1)
        return head.removeprefix(self.think_open or ""), tail

    def reasoning_block(self, record: GenerationRecord, prompt_end: str, reasoning: str, content: str) -> list[Piece]:
        """``<think>`` unless the prompt already ends with it, the reasoning, ``</think>`` once answered."""
        if self.think_open is None or (not reasoning and not self.thinks) or self.thinking_off(prompt_end):
            return []
        pieces: list[Piece] = []
        if not prompt_end.rstrip("\n").endswith(self.think_open):
            pieces.append(self.marker(self.think_open))
        pieces += [reasoning] if reasoning else []
        cut_while_thinking = record.finish_reason == "length" and not content and not record.tool_calls
        if not cut_while_thinking:
            pieces.append(self.marker(self.think_close))
        return pieces

    def thinking_off(self, prompt_end: str) -> bool:
        """The prompt already closed an empty think block (a template's thinking-off switch)."""
        return self.think_close is not None and prompt_end.rstrip().endswith(self.think_close)

    def tool_calls(self, record: GenerationRecord, content: str) -> list[Piece]:
        if record.tool_calls:
            raise PlanError(f"format {self.name} has no tool-call grammar")
        return []

    def malformed_markup(self, text: str) -> bool:
        """Whether raw markers inside text are out of order (only formats with marker grammars check)."""
        return False


def json_args(arguments: str) -> Any:
    """Parsed tool-call arguments; unparsable arguments make the sample unplannable."""
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        raise PlanError(f"tool-call arguments are not JSON: {arguments[:60]!r}") from None
