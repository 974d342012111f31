"""ChatML (SmolLM2, Qwen2.5): ``<|im_start|>assistant\\n`` … content … ``<|im_end|>``.

Tool calls follow Qwen2.5's template: ``\\n<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>``
after the content; ``<tool_call>`` is an added token in Qwen's vocabulary and text elsewhere.
"""

from __future__ import annotations

import json

from eyas.records import GenerationRecord
from eyas.tokenize.formats.base import Format, Piece, json_args, tool_call_parts


def hermes_tool_calls(fmt: Format, record: GenerationRecord, content: str) -> list[Piece]:
    """Qwen-style ``<tool_call>`` JSON blocks, joined as the templates join them."""
    pieces: list[Piece] = []
    for i, call in enumerate(record.tool_calls or []):
        name, args = tool_call_parts(call)
        body = json.dumps({"name": name, "arguments": json_args(args)}, ensure_ascii=False)
        lead = "\n" if (i > 0 or content) else ""
        pieces += [lead, fmt.marker("<tool_call>"), "\n" + body + "\n", fmt.marker("</tool_call>")]
    return [p for p in pieces if p != ""]


class ChatML(Format):
    name = "chatml"
    end_of_turn = "<|im_end|>"
    emitted = ("<tool_call>", "</tool_call>")

    def tool_calls(self, record: GenerationRecord, content: str) -> list[Piece]:
        return hermes_tool_calls(self, record, content)
