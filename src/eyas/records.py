"""Records passed between stages: the contract every stage reads and writes.

Dependency-free on purpose (no torch, no transformers) so any tool can read eyas output.
``SCHEMA_VERSION`` changes whenever a field changes meaning; readers refuse newer versions.

- ``PromptRecord``: one prompt to regenerate (stage 1 → stage 2).
- ``GenerationRecord``: one regenerated response, the same for every backend (stage 2 → 3).
- ``TOKENIZED_COLUMNS``: the Parquet columns of rebuilt samples (stage 3 → 4 → 5/6).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1

Message = dict[str, Any]


def content_hash(payload: Any) -> str:
    """A short stable hash of JSON-serialisable content (used for prompt ids)."""
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class PromptRecord:
    prompt_id: str
    """The row's own id/uuid when it has one, else a hash of its content; `<id>#<turn>` per turn."""
    dataset: str
    messages: list[Message]
    """Conversation so far in OpenAI format; the next turn is the assistant's."""
    tools: list[dict[str, Any]] | None = None
    turn: int | None = None
    """With `multi_turn: all`: which assistant turn this is; earlier assistant turns are
    replaced by the model's own answers (records `<base id>#<j>`) at generation time."""
    answer: Message | None = None
    """The row's own assistant turn answering `messages`, for datasets used as they are
    (`regenerate: false`); earlier turns then stay as the row has them."""
    sample: int = 0
    """Which of `generate.samples_per_prompt` answers to the row this asks for (0: the first,
    whose `prompt_id` is the row's; see :func:`sample_prompt_id`)."""

    @property
    def record_id(self) -> str:
        """Id of the generation record answering this prompt: unique across datasets."""
        return record_id(self.dataset, self.prompt_id)


def record_id(dataset: str, prompt_id: str) -> str:
    return f"{dataset}/{prompt_id}"


SAMPLE_MARK = "~"
"""Between a row's id and the number of a further answer to it: `<id>~<j>`, and `<id>~<j>#<turn>`
for a conversation's turns, so each answer keeps its own conversation."""


def _numbered(prompt_id: str, mark: str) -> tuple[str, str]:
    """``(head, mark + number)`` when ``prompt_id`` ends in ``mark`` and a number, else ``(prompt_id, "")``."""
    head, sep, number = prompt_id.rpartition(mark)
    return (head, sep + number) if sep and number.isdigit() else (prompt_id, "")


def sample_prompt_id(prompt_id: str, sample: int) -> str:
    """The prompt id of answer ``sample`` to a row: the row's own for the first (so a run that
    asks for more answers keeps the ones it has), ``<id>~<sample>`` before any turn number after."""
    if sample == 0:
        return prompt_id
    head, turn = _numbered(prompt_id, "#")
    return f"{head}{SAMPLE_MARK}{sample}{turn}"


def row_prompt_id(prompt_id: str) -> str:
    """The row a prompt id answers: its turn and sample numbers dropped (`<id>~<j>#<turn>` → `<id>`),
    so every turn and every answer of one row is held out, or subset, together."""
    return _numbered(_numbered(prompt_id, "#")[0], SAMPLE_MARK)[0]


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float = 0.0
    """USD actually charged (0 for local servers)."""


@dataclass
class GenerationRecord:
    id: str
    """`<dataset>/<prompt_id>`."""
    dataset: str
    prompt_id: str
    messages: list[Message]
    content: str
    finish_reason: str
    """`stop` (end of turn produced), `length` (max_tokens ran out), `tool_calls`."""
    usage: Usage
    model: str
    provider: str
    """Who served it: `local` for the in-process backend, the provider name for APIs."""
    created: float
    """Unix time the record was completed."""
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    token_ids: list[int] | None = None
    """The completion's true ids as sampled (local backend only): the ground truth for tokenize."""
    generation_id: str | None = None
    latency_s: float | None = None
    attempts: int = 1
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        # A shallow dict, not dataclasses.asdict: asdict deep-copies every message, which was the
        # largest CPU cost per record at 2,000 requests in flight (bench/generate_http.py).
        data = {k: v for k, v in vars(self).items() if v is not None or k in _ALWAYS_WRITTEN}
        data["usage"] = vars(self.usage)
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationRecord:
        version = data.get("schema_version", SCHEMA_VERSION)
        if version > SCHEMA_VERSION:
            raise ValueError(f"record schema version {version} is newer than this eyas ({SCHEMA_VERSION})")
        fields = dict(data)
        fields["usage"] = Usage(**fields.get("usage", {}))
        return cls(**fields)


_ALWAYS_WRITTEN = {"reasoning", "tool_calls"}


TOKENIZED_COLUMNS = (
    "id",
    "dataset",
    "input_ids",
    "loss_mask",
    "num_tokens",
    "completion_tokens",
    "billed_completion_tokens",
    "finish_reason",
    "format",
    "flags",
)
"""Columns of tokenize and merge Parquet files: `input_ids` list<int32>, `loss_mask` list<uint8>."""


def tokenized_arrow_schema():
    """The pyarrow schema of tokenize/merge Parquet files (pyarrow imported only when asked)."""
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("dataset", pa.string()),
            ("input_ids", pa.list_(pa.int32())),
            ("loss_mask", pa.list_(pa.uint8())),
            ("num_tokens", pa.int32()),
            ("completion_tokens", pa.int32()),
            ("billed_completion_tokens", pa.int32()),
            ("finish_reason", pa.string()),
            ("format", pa.string()),
            ("flags", pa.list_(pa.string())),
        ]
    )


@dataclass
class TokenizedSample:
    id: str
    dataset: str
    input_ids: list[int]
    loss_mask: list[int]
    completion_tokens: int
    billed_completion_tokens: int | None
    finish_reason: str
    format: str
    flags: list[str] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)
