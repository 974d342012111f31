"""The records a dataset's file holds are exactly those of today's prompt selection.

Generation skips every prompt whose record is already in ``<run_dir>/generate/<dataset>.jsonl``
and tokenize reads every record there, so a record the config no longer selects would be
trained on though nothing asked for it: a prompt dropped by a lower ``max_prompts`` or an edited
source, the dataset's own answer after ``regenerate: false`` became ``true``, an as-is answer
edited under the same ``id``, answers past a lowered ``output_token_target``.

:func:`reconcile` runs before and after every generation. It keeps, in file order, each record
whose prompt is selected today and that answers it as today's config would (same conversation,
same kind of answer, the token target not yet reached before it); the rest are moved to
``generate/superseded-<time>-unselected/<dataset>.jsonl`` with the settings they were made under — never
deleted, since an API answer cost money. A selected prompt with no record takes one back from
those files when its conversation and sampling settings are identical, so lowering and raising
``max_prompts`` again regenerates nothing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

from eyas.config import DatasetConfig
from eyas.files import fsync_file, write_text_atomic
from eyas.generate.as_is import PROVIDER, answer_record
from eyas.generate.store import DatasetProgress, conversation_for, read_records, save_settings
from eyas.generate.wanted import wanted
from eyas.jsonl import recover
from eyas.paths import RunPaths
from eyas.records import GenerationRecord, PromptRecord

log = logging.getLogger(__name__)

SETTINGS = "settings.json"
"""The sampling settings records were made under, beside them in ``generate/`` and in every
superseded folder (:func:`eyas.generate._guard_settings` moves it along with the records)."""


def reconcile(dataset: DatasetConfig, paths: RunPaths, settings: dict, samples_per_prompt: int) -> tuple[int, int]:
    """Make the dataset's records file hold only today's selection (``samples_per_prompt`` answers
    to each prompt); returns (set aside, taken back)."""
    path = paths.generations(dataset.name)
    recover(path)
    records = list(read_records(path))
    prompts = {p.record_id: p for p in wanted(dataset, samples_per_prompt)}
    kept, aside = _split(dataset, prompts, records)
    reused = [] if not dataset.regenerate else list(_take_back(dataset, prompts, kept, paths, settings))
    if not aside and not reused:
        return 0, 0
    if aside:
        _set_aside(paths, dataset.name, aside, settings)
    write_text_atomic(path, "".join(r.to_json() + "\n" for r in [*kept, *reused]))
    if aside:
        log.warning(
            "%s: %d records no longer selected by the config moved to %s", dataset.name, len(aside), paths.generate_dir
        )
    if reused:
        log.info(
            "%s: %d records taken back from earlier superseded ones (same prompt and settings)",
            dataset.name,
            len(reused),
        )
    return len(aside), len(reused)


def _split(
    dataset: DatasetConfig, prompts: dict[str, PromptRecord], records: list[GenerationRecord]
) -> tuple[list[GenerationRecord], list[GenerationRecord]]:
    kept, aside, progress = [], [], DatasetProgress()
    for record in records:
        prompt = prompts.get(record.id)
        if prompt is not None and record.id not in progress.done and _answers(dataset, prompt, record, progress):
            kept.append(record)
            progress.add(record)
        else:
            aside.append(record)
    return kept, aside


def _answers(dataset: DatasetConfig, prompt: PromptRecord, record: GenerationRecord, progress: DatasetProgress) -> bool:
    """Whether ``record`` is the answer today's config would have for ``prompt``, given the records
    kept before it (earlier turns of its conversation, tokens towards the target)."""
    target = dataset.output_token_target
    if target is not None and progress.completion_tokens >= target:
        return False
    if not dataset.regenerate:
        expected = answer_record(prompt)
        return record.provider == PROVIDER and all(
            getattr(record, k) == getattr(expected, k)
            for k in ("messages", "content", "reasoning", "tool_calls", "tools")
        )
    return (
        record.provider != PROVIDER
        and record.tools == prompt.tools
        and record.messages == conversation_for(prompt, progress)
    )


def _take_back(
    dataset: DatasetConfig,
    prompts: dict[str, PromptRecord],
    kept: list[GenerationRecord],
    paths: RunPaths,
    settings: dict,
) -> Iterator[GenerationRecord]:
    """Superseded records made under today's settings for selected prompts that have none, in
    prompt order (so a conversation's earlier turns come back before its later ones)."""
    pool = _superseded(paths, dataset.name, settings)
    if not pool:
        return
    progress = DatasetProgress()
    for record in kept:
        progress.add(record)
    for record_id, prompt in prompts.items():
        candidate = pool.get(record_id)
        if record_id in progress.done or candidate is None:
            continue
        if not _answers(dataset, prompt, candidate, progress):
            continue
        progress.add(candidate)
        yield candidate


def _superseded(paths: RunPaths, dataset: str, settings: dict) -> dict[str, GenerationRecord]:
    """Every set-aside record of ``dataset`` made under ``settings``, newest folder first."""
    pool: dict[str, GenerationRecord] = {}
    for folder in sorted(paths.generate_dir.glob("superseded-*"), reverse=True):
        made_under = folder / SETTINGS
        if not made_under.is_file() or json.loads(made_under.read_text()) != settings:
            continue
        for record in read_records(folder / f"{dataset}.jsonl"):
            pool.setdefault(record.id, record)
    return pool


def _set_aside(paths: RunPaths, dataset: str, records: list[GenerationRecord], settings: dict) -> Path:
    """Append ``records`` to a superseded folder of their own (``--redo``'s, named alike, holds
    records of other settings with those settings)."""
    folder = paths.generate_dir / f"superseded-{time.strftime('%Y%m%d-%H%M%S')}-unselected"
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / SETTINGS).exists():
        save_settings(folder / SETTINGS, settings)
    out = folder / f"{dataset}.jsonl"
    with out.open("a", encoding="utf-8") as f:
        f.write("".join(r.to_json() + "\n" for r in records))
    fsync_file(out)
    return folder
