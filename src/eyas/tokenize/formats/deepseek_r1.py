"""DeepSeek-R1: reasoning ``</think>`` content ``<｜end▁of▁sentence｜>``.

Newer R1 templates end the generation prompt with ``<think>\\n``; the open tag is emitted by
the model only when the prompt does not already end with it. Text is joined as the server
returned it (vLLM's ``deepseek_r1`` parser does not strip); stripped whitespace is recovered
by billing. The model ends its reasoning with a newline and opens its answer after
``</think>\\n\\n``; those are its ``separators``.
"""

from __future__ import annotations

from eyas.records import GenerationRecord
from eyas.tokenize.formats.base import Format, Piece, json_args, tool_call_parts

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"


class DeepSeekR1(Format):
    name = "deepseek-r1"
    end_of_turn = "<｜end▁of▁sentence｜>"
    think_open = "<think>"
    think_close = "</think>"
    thinks = True
    emitted = ("<think>", "</think>", CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_SEP, CALL_END)
    separators = {("reasoning", "trail"): "\n", ("content", "lead"): "\n\n"}
    """``…\\n</think>\\n\\n…``: what a server that strips both segments removes."""

    def tool_calls(self, record: GenerationRecord, content: str) -> list[Piece]:
        if not record.tool_calls:
            return []
        pieces: list[Piece] = [self.marker(CALLS_BEGIN)]
        for call in record.tool_calls:
            name, args = tool_call_parts(call)
            json_args(args)
            pieces += [self.marker(CALL_BEGIN), "function", self.marker(CALL_SEP)]
            pieces += [f"{name}\n```json\n{args}\n```", self.marker(CALL_END)]
        return pieces + [self.marker(CALLS_END)]
