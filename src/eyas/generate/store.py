"""The generation records of one dataset: the one writer every backend uses, and resume.

``<run_dir>/generate/<dataset>.jsonl`` holds one :class:`GenerationRecord` per completed
prompt. Records are appended whole and flushed as they complete; on open, a torn last line
from a killed run is dropped (:func:`eyas.jsonl.recover`) and the ids already present are
skipped, so a rerun generates nothing twice.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from eyas.files import write_json_atomic
from eyas.jsonl import DurableAppender, JsonlError, read_jsonl, recover
from eyas.records import GenerationRecord, PromptRecord, Usage


@dataclass
class DatasetProgress:
    """What a dataset's records file holds so far."""

    done: set[str] = field(default_factory=set)
    completion_tokens: int = 0
    finish_reasons: Counter = field(default_factory=Counter)
    contents: dict[str, str] = field(default_factory=dict)
    """Completed answers of multi-turn records (`<id>#<turn>`), needed to build later turns."""

    def add(self, record: GenerationRecord) -> None:
        self.done.add(record.id)
        self.completion_tokens += record.usage.completion_tokens
        self.finish_reasons[record.finish_reason] += 1
        if "#" in record.prompt_id:
            self.contents[record.prompt_id] = record.content


def read_records(path: Path) -> Iterator[GenerationRecord]:
    """The file's generation records; a line that is not one is an error naming file:line."""
    if not path.exists():
        return
    for lineno, data in read_jsonl(path):
        try:
            yield GenerationRecord.from_dict(data)
        except (TypeError, ValueError) as e:
            raise JsonlError(f"{path}:{lineno}: not a generation record ({e})") from None


def scan(path: Path) -> DatasetProgress:
    """Recover a torn tail, then summarise the records already written."""
    recover(path)
    progress = DatasetProgress()
    for record in read_records(path):
        progress.add(record)
    return progress


class RecordWriter:
    """Appends completed records; fsyncs at least once a second so a crash loses at most that."""

    def __init__(self, path: Path, progress: DatasetProgress):
        self._out = DurableAppender(path)
        self.progress = progress

    def write(self, record: GenerationRecord) -> None:
        if record.id in self.progress.done:
            return
        self._out.write(record.to_json())
        self.progress.add(record)

    def close(self) -> None:
        self._out.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def conversation_for(prompt: PromptRecord, progress: DatasetProgress) -> list[dict] | None:
    """The messages to send: earlier assistant turns swapped for the model's own answers.

    Returns None while an earlier turn of the same conversation is not generated yet.
    """
    if prompt.turn is None or prompt.turn == 0:
        return prompt.messages
    base = prompt.prompt_id.rsplit("#", 1)[0]
    messages, turn = [], 0
    for m in prompt.messages:
        if m["role"] == "assistant":
            answer = progress.contents.get(f"{base}#{turn}")
            if answer is None:
                return None
            m = {"role": "assistant", "content": answer}
            turn += 1
        messages.append(m)
    return messages


def make_record(
    prompt: PromptRecord, messages: list[dict], *, content: str, finish_reason: str, model: str, provider: str, **extra
) -> GenerationRecord:
    """The one place a GenerationRecord is built from a prompt, for every backend."""
    usage = extra.pop("usage", None) or Usage()
    return GenerationRecord(
        id=prompt.record_id,
        dataset=prompt.dataset,
        prompt_id=prompt.prompt_id,
        messages=messages,
        tools=prompt.tools,
        content=content,
        finish_reason=finish_reason,
        usage=usage,
        model=model,
        provider=provider,
        created=time.time(),
        **extra,
    )


def settings_changes(path: Path, settings: dict) -> dict[str, tuple]:
    """``{name: (recorded, now)}`` for every sampling setting that differs from the records' own
    (``path``, written when the first records were); empty when they match or none were made."""
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    return {k: (old.get(k), settings.get(k)) for k in sorted({*old, *settings}) if old.get(k) != settings.get(k)}


def save_settings(path: Path, settings: dict) -> None:
    write_json_atomic(path, settings, sort_keys=True)
