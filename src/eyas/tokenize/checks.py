"""Structural checks on a rebuilt completion; each failure is a flag on the sample.

End of turn present exactly when the turn ended (not on ``length``); reasoning present when
the format always reasons; raw tool-call markup in the text in a well-formed order; tool-call
arguments that parse as JSON; an answer that is not empty.
"""

from __future__ import annotations

import json

from eyas.records import GenerationRecord
from eyas.tokenize.formats import ENDS_TURN, Format


def structural_flags(fmt: Format, record: GenerationRecord, completion_ids: list[int], stop_string: bool) -> list[str]:
    """``stop_string``: billing showed a stop string, not the end-of-turn token, ended the turn."""
    flags = []
    ends = bool(completion_ids) and completion_ids[-1] == fmt.end_of_turn_id
    if ends != (record.finish_reason in ENDS_TURN and not stop_string):
        flags.append("end-of-turn-wrong")
    if fmt.thinks and not (record.reasoning or fmt.think_close in (record.content or "")):
        flags.append("reasoning-missing")
    if fmt.has_markers(record.content or "") and fmt.malformed_markup(record.content or ""):
        flags.append("tool-markup-malformed")
    for call in record.tool_calls or []:
        args = (call.get("function") or {}).get("arguments", "")
        if isinstance(args, str) and args.strip() and not _is_json(args):
            flags.append("tool-args-not-json")
            break
    if not (record.content or "").strip() and not record.tool_calls and record.finish_reason != "length":
        flags.append("empty-content")
    return flags


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
