"""The answers generate makes for a dataset: every prompt stage 1 reads, ``samples_per_prompt`` times.

Several answers to one prompt at a temperature above 0 are more of the target's own writing
without more prompts, for teams whose prompt set is what it is. The first answer keeps the
prompt's own id and each further one is its own prompt record (``<id>~<j>``,
:func:`eyas.records.sample_prompt_id`), so resume, selection, budgets and later stages treat it
as any other answer, and raising the count keeps the answers already made. A dataset used as it
is has one answer per prompt, its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from eyas.config import DatasetConfig
from eyas.prompts import PromptStats, iter_prompts
from eyas.records import PromptRecord, sample_prompt_id


def wanted(
    dataset: DatasetConfig, samples_per_prompt: int, stats: PromptStats | None = None, report: bool = True
) -> Iterator[PromptRecord]:
    """Every answer to make, in prompt order; a conversation's turns stay in order within each answer."""
    samples = samples_per_prompt if dataset.regenerate else 1
    for prompt in iter_prompts(dataset, stats, report):
        yield prompt
        for j in range(1, samples):
            yield replace(prompt, prompt_id=sample_prompt_id(prompt.prompt_id, j), sample=j)
