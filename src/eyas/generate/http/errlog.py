"""``<dataset>.errors.jsonl``: requests that used up their attempts, with the reason.

They are not done, so the next run retries them. On open the file is compacted — entries
for ids done since are dropped, and only the latest entry per id is kept — so it always
lists what is still failing, once each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eyas.files import write_text_atomic
from eyas.jsonl import DurableAppender, read_jsonl, recover


def compact(path: Path, done: set[str]) -> int:
    """Rewrite the file keeping the latest entry of each id not in ``done``; return how many remain."""
    if not path.exists():
        return 0
    recover(path)
    latest: dict[str, dict[str, Any]] = {}
    for _, entry in read_jsonl(path):
        if entry.get("id") not in done:
            latest[entry.get("id")] = entry
    write_text_atomic(path, "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in latest.values()))
    return len(latest)


class ErrorLog:
    def __init__(self, path: Path, done: set[str]):
        self.earlier = compact(path, done)
        """Entries left by earlier runs: prompts this run retries."""
        self._out = DurableAppender(path)

    def write(self, entry: dict[str, Any]) -> None:
        self._out.write_json(entry)

    def close(self) -> None:
        self._out.close()
