"""Llama 3.x: ``<|start_header_id|>assistant<|end_header_id|>\\n\\n`` content ``<|eot_id|>``.

Tool calls are JSON in the content, as Llama 3.1's template writes them:
``{"name": …, "parameters": …}``.
"""

from __future__ import annotations

import json

from eyas.records import GenerationRecord
from eyas.tokenize.formats.base import Format, Piece, json_args, tool_call_parts


class Llama3(Format):
    name = "llama3"
    end_of_turn = "<|eot_id|>"
    emitted = ("<|python_tag|>",)

    def tool_calls(self, record: GenerationRecord, content: str) -> list[Piece]:
        pieces: list[Piece] = []
        for call in record.tool_calls or []:
            name, args = tool_call_parts(call)
            pieces.append(json.dumps({"name": name, "parameters": json_args(args)}, ensure_ascii=False))
        return pieces
