"""What generate will have written once every prompt is answered, before it has: each sample's
length in tokens and the bytes of the records still to write. Disk space is planned from it
before anything is spent (``eyas run``'s check before generating; ``eyas estimate`` before
tokenize).

An answered prompt counts as it is: its record's token counts and its line's bytes. A prompt
still to answer counts its prompt at :func:`estimate_prompt_tokens` (one token per three bytes:
high on purpose) and its answer at ``generate.max_tokens``, since every answer may run to the
cap; a dataset with ``output_token_target`` stops counting there, as generation does. A dataset
used as it is (``regenerate: false``) counts its rows' own answers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from eyas.config import RunConfig
from eyas.generate.http.budget import estimate_prompt_tokens
from eyas.generate.store import read_records, scan
from eyas.generate.wanted import wanted
from eyas.paths import RunPaths

RECORD_BYTES_PER_TOKEN = 16
"""A record's bytes per answer token beyond its prompt's JSON: the text (about 4 bytes a token,
more where JSON escapes it) and the token's id in ``token_ids`` (up to 6 digits and a separator)."""
RECORD_OVERHEAD_BYTES = 400
"""A record's fixed fields: ids, usage, model, provider, times, finish reason."""


@dataclass(frozen=True)
class Expected:
    lengths: dict[str, list[int]]
    """Per dataset the run keeps (``drop`` ones left out): every sample's tokens, prompt and answer."""
    record_bytes: int
    """What the records still to write will add to ``generate/``."""


def expected(config: RunConfig) -> Expected:
    paths = RunPaths.of(config)
    lengths: dict[str, list[int]] = {}
    to_write = 0
    for dataset in config.datasets:
        path = paths.generations(dataset.name)
        if path.is_file():
            scan(path)  # a torn last line of a killed run goes, as generate's next start would drop it
        answered = {r.id: r for r in read_records(path)}
        mine: list[int] = []
        output = sum(r.usage.completion_tokens for r in answered.values())
        for prompt in wanted(dataset, config.generate.samples_per_prompt, report=False):
            if prompt.record_id in answered:
                mine.append(_tokens(answered[prompt.record_id]))
                continue
            target = dataset.output_token_target
            if target is not None and output >= target:
                break
            prompt_tokens = estimate_prompt_tokens(prompt.messages, prompt.tools)
            if prompt.answer is not None:
                answer = estimate_prompt_tokens([prompt.answer])
            else:
                answer = config.generate.max_tokens
            output += answer
            mine.append(prompt_tokens + answer)
            messages = len(json.dumps(prompt.messages, ensure_ascii=False).encode())
            to_write += messages + answer * RECORD_BYTES_PER_TOKEN + RECORD_OVERHEAD_BYTES
        if not dataset.drop:
            lengths[dataset.name] = mine
    return Expected(lengths, to_write)


def _tokens(record) -> int:
    """A record's tokens: as counted when it was made, else (a dataset's own answer, never
    billed) estimated from its text."""
    counted = record.usage.prompt_tokens + record.usage.completion_tokens
    answer = {"role": "assistant", "content": record.content}
    return counted or estimate_prompt_tokens([*record.messages, answer])
