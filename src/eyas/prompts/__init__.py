"""Stage 1 — prompts: read a configured dataset into prompt records.

Consumes a dataset source (see :mod:`eyas.prompts.sources`) in any supported row format
(:mod:`eyas.prompts.formats`); produces :class:`~eyas.records.PromptRecord` s with ids stable
across runs, duplicates dropped and counted, and every skipped row reported with its
location and reason. Nothing is skipped silently; a source with no usable rows is an error.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from eyas.config import ConfigError, DatasetConfig
from eyas.prompts.formats import RowError, row_messages
from eyas.prompts.sources import iter_rows
from eyas.records import Message, PromptRecord, content_hash

log = logging.getLogger(__name__)

MAX_SKIPS_LOGGED = 20


@dataclass
class PromptStats:
    rows: int = 0
    prompts: int = 0
    duplicates: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(location, reason) of every row that was not used."""


def iter_prompts(
    dataset: DatasetConfig, stats: PromptStats | None = None, report: bool = True
) -> Iterator[PromptRecord]:
    """Stream the dataset's prompt records; ``stats`` is filled in as rows are read. ``report``:
    log each skipped row (not for a planning pass over rows the stage itself reads again)."""
    stats = stats if stats is not None else PromptStats()
    seen: set[str] = set()
    for row in iter_rows(dataset):
        if dataset.max_prompts is not None and stats.prompts >= dataset.max_prompts:
            break
        stats.rows += 1
        try:
            if row.error:
                raise RowError(row.error)
            messages, tools = row_messages(row.data, dataset.format)
            base_id = _row_id(row.data, messages, tools)
            records = list(_turn_records(dataset, base_id, messages, tools))
        except RowError as e:
            _skip(stats, row.location, str(e), report)
            continue
        if base_id in seen:
            stats.duplicates += 1
            continue
        seen.add(base_id)
        stats.prompts += 1
        yield from records
    if stats.prompts == 0:
        raise ConfigError(
            f"datasets[{dataset.name}]: {dataset.source} has no usable prompt rows "
            f"({stats.rows} read, {len(stats.skipped)} skipped)"
        )
    if len(stats.skipped) > MAX_SKIPS_LOGGED:
        log.warning("%s: %d more rows skipped", dataset.name, len(stats.skipped) - MAX_SKIPS_LOGGED)


def load_prompts(dataset: DatasetConfig) -> tuple[list[PromptRecord], PromptStats]:
    stats = PromptStats()
    return list(iter_prompts(dataset, stats)), stats


def _skip(stats: PromptStats, location: str, reason: str, report: bool) -> None:
    stats.skipped.append((location, reason))
    if report and len(stats.skipped) <= MAX_SKIPS_LOGGED:
        log.warning("%s: skipped row: %s", location, reason)


def _row_id(row: dict, messages: list[Message], tools: list | None) -> str:
    for key in ("id", "uuid", "prompt_id"):
        value = row.get(key)
        if isinstance(value, (str, int)) and str(value).strip():
            return str(value)
    return content_hash({"messages": messages, "tools": tools})


def _turn_records(
    dataset: DatasetConfig, base_id: str, messages: list[Message], tools: list | None
) -> Iterator[PromptRecord]:
    if not any(m["role"] == "user" for m in messages):
        raise RowError("the conversation has no user turn")
    if not dataset.regenerate:
        yield from _answered_turns(dataset, base_id, messages, tools)
        return
    if dataset.multi_turn == "last":
        if messages[-1]["role"] == "assistant":
            messages = messages[:-1]
        if messages[-1]["role"] not in ("user", "tool"):
            raise RowError(f"the conversation ends with a {messages[-1]['role']} turn, nothing to answer")
        yield PromptRecord(base_id, dataset.name, messages, tools)
        return
    # multi_turn: all — one record per assistant turn; generation swaps earlier answers for the model's own.
    turn = 0
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            if i > 0 and messages[i - 1]["role"] in ("user", "tool"):
                yield PromptRecord(f"{base_id}#{turn}", dataset.name, messages[:i], tools, turn=turn)
            turn += 1
    if messages[-1]["role"] in ("user", "tool"):
        yield PromptRecord(f"{base_id}#{turn}", dataset.name, messages, tools, turn=turn)


def _answered_turns(
    dataset: DatasetConfig, base_id: str, messages: list[Message], tools: list | None
) -> Iterator[PromptRecord]:
    """A dataset used as it is: one record per assistant turn that answers a user or tool turn,
    carrying that turn as its answer; `last` keeps only the final one, which must end the row."""
    answered = [
        i
        for i, m in enumerate(messages)
        if m["role"] == "assistant" and i > 0 and messages[i - 1]["role"] in ("user", "tool")
    ]
    if dataset.multi_turn == "last":
        if messages[-1]["role"] != "assistant":
            raise RowError(
                f"the conversation ends with a {messages[-1]['role']} turn, not an assistant answer to train on "
                "(regenerate: false uses the rows' own answers)"
            )
        if not answered or answered[-1] != len(messages) - 1:
            raise RowError("the final assistant turn follows another assistant turn, not a user or tool turn")
        yield PromptRecord(base_id, dataset.name, messages[:-1], tools, answer=messages[-1])
        return
    if not answered:
        raise RowError("no assistant turn answers a user turn (regenerate: false uses the rows' own answers)")
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for i in answered:
        turn = turns.index(i)
        yield PromptRecord(f"{base_id}#{turn}", dataset.name, messages[:i], tools, turn=turn, answer=messages[i])
