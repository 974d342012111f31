"""Qwen3 thinking: ``<think>\\n`` reasoning ``\\n</think>\\n\\n`` content ``<|im_end|>``.

The whitespace around the think tags is the template's own (reasoning stripped of newlines,
content of leading newlines); servers that return it differently are recovered by billing.
"""

from __future__ import annotations

from eyas.tokenize.formats.base import Format, Piece
from eyas.tokenize.formats.chatml import hermes_tool_calls


class Qwen3(Format):
    name = "qwen3"
    end_of_turn = "<|im_end|>"
    think_open = "<think>"
    think_close = "</think>"
    thinks = True
    emitted = ("<think>", "</think>", "<tool_call>", "</tool_call>")
    separators: dict[tuple[str, str], str] = {}
    """None to restore: the layout writes ``<think>\\n``, ``\\n</think>\\n\\n`` itself, whatever the server returned."""

    def body(self, record, prompt_end, reasoning, content, markers_as_specials) -> list[Piece]:
        reasoning, content = self.raw_reasoning(reasoning, content, markers_as_specials)
        if self.thinking_off(prompt_end):
            return self.text(content, markers_as_specials) + hermes_tool_calls(self, record, content)
        pieces: list[Piece] = []
        if not prompt_end.rstrip("\n").endswith(self.think_open):
            pieces.append(self.marker(self.think_open))
        if record.finish_reason == "length" and not content and not record.tool_calls:
            return pieces + ["\n" + reasoning.lstrip("\n")]
        pieces += ["\n" + reasoning.strip("\n") + "\n" if reasoning else "\n\n", self.marker(self.think_close), "\n\n"]
        pieces += self.text(content.lstrip("\n"), markers_as_specials)
        pieces += hermes_tool_calls(self, record, content)
        return pieces
