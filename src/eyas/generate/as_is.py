"""Datasets used as they are (``regenerate: false``): the rows' own answers become the records.

Serving logs and public chat sets already hold the conversations to train on. Their assistant
turns are written to ``<run_dir>/generate/<dataset>.jsonl`` as generation records with provider
``dataset`` and no billed token count, so tokenize rebuilds and checks their ids, merge mixes
them with regenerated datasets, and extraction runs the target on them like any other sample:
the states, and the target's next-token distribution the drafter learns, are the target's own.
No target call and no API key are needed to write them.
"""

from __future__ import annotations

import logging

from eyas.config import DatasetConfig
from eyas.generate.store import RecordWriter, make_record, scan
from eyas.paths import RunPaths
from eyas.prompts import iter_prompts
from eyas.records import GenerationRecord, Message, PromptRecord

log = logging.getLogger(__name__)

PROVIDER = "dataset"
"""The ``provider`` of records whose answer came from the dataset, not from a model."""


def write_answers(dataset: DatasetConfig, paths: RunPaths) -> int:
    """Append a record for every answered turn not written yet; returns how many were added."""
    path = paths.generations(dataset.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = scan(path)
    added = 0
    with RecordWriter(path, state) as writer:
        for prompt in iter_prompts(dataset):
            if prompt.record_id in state.done:
                continue
            writer.write(answer_record(prompt))
            added += 1
    log.info("%s: used as it is, %d answers (%d new)", dataset.name, len(state.done), added)
    return added


def answer_record(prompt: PromptRecord) -> GenerationRecord:
    """The record of a dataset's own answer to ``prompt``: what generate writes, and what
    :mod:`eyas.generate.selection` compares a kept record with."""
    answer = prompt.answer or {}
    tool_calls = answer.get("tool_calls") or None
    return make_record(
        prompt,
        prompt.messages,
        content=answer_text(answer),
        finish_reason="tool_calls" if tool_calls else "stop",
        model=answer.get("model") or "",
        provider=PROVIDER,
        reasoning=answer.get("reasoning_content") or answer.get("reasoning") or None,
        tool_calls=tool_calls,
    )


def answer_text(message: Message) -> str:
    """The text of an assistant turn whose content is a string, a list of text parts, or absent."""
    content = message.get("content")
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""
