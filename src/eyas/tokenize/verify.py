"""Ground-truth proof: compare rebuilt completion ids with the ids the model actually sampled.

Local-backend records carry ``token_ids``. Each mismatch is reported with the first differing
position, the two tokens there, and a cause:

- ``special-inside-text``: the model emitted a special token mid-answer; the text decodes it to
  its string and the rebuild, correctly for text, keeps that string as text.
- ``partial-utf8``: the answer was cut inside a multi-byte character, which decodes to U+FFFD.
- ``non-canonical-merge``: both id lists decode to the same text, but sampling picked a merge
  the BPE never produces — a known limit of rebuilding from text.
- ``text-differs``: the rebuilt text itself differs (a format or server-side text problem).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from eyas.tokenize.rebuild import Sample


@dataclass
class Mismatch:
    id: str
    finish_reason: str
    position: int
    truth_token: str | None
    rebuilt_token: str | None
    cause: str

    def to_dict(self) -> dict:
        return asdict(self)


def first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def compare(sample: Sample, encoder) -> Mismatch | None:
    """None when the rebuild equals the sampled ids, else where and why it differs."""
    truth, rebuilt = sample.record.token_ids, sample.completion_ids
    if truth is None or truth == rebuilt:
        return None
    pos = first_difference(truth, rebuilt)

    def token(ids: list[int]) -> str | None:
        return encoder.token_str(ids[pos]) if pos < len(ids) else None

    return Mismatch(
        sample.record.id, sample.record.finish_reason, pos, token(truth), token(rebuilt), _cause(sample, encoder)
    )


def _cause(sample: Sample, encoder) -> str:
    truth = sample.record.token_ids or []
    body = truth[:-1] if sample.record.finish_reason in ("stop", "tool_calls") else truth
    if not encoder.special_ids.isdisjoint(body):
        return "special-inside-text"
    text = (sample.record.reasoning or "") + (sample.record.content or "")
    if "\ufffd" in text:
        return "partial-utf8"
    if encoder.decode(truth) == encoder.decode(sample.completion_ids):
        return "non-canonical-merge"
    return "text-differs"
