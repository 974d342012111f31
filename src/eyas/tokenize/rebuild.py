"""Rebuild exact ids from API text: lay out every record, encode in batches, match billing.

Per chunk of records, the format lays out each prompt and completion as pieces; all text of
the chunk goes to the Rust tokenizer in one batch call per parsing mode (that is the speed:
see ``bench/tokenize_rebuild.py``), and the ids are joined with the specials in between.

A completion whose length disagrees with the billed completion tokens is tried in its other
readings, fewest changes first, and the first that matches billing wins (named in ``flags``):
a ``stop`` turn without its end-of-turn token (when ``generate.stop`` strings were set); raw
tool/think markers in the text read as text instead of special tokens; then whitespace
restored at the reasoning and content edges, which some servers strip. Whitespace is only
tried within ``MAX_WHITESPACE_DELTA`` tokens of billing and at most two edges at once: that
covers ``.strip()`` on both segments while bounding the work on samples that are off for
other reasons. Several readings can share a length; the order above is the tie-break, except
that when whitespace restored at different edges ties (e.g. ``\\n\\n`` after ``</think>`` versus a
space ending the reasoning, one token each), the format's documented separator wins
(``Format.separators``) and the sample is flagged ``ambiguous-whitespace``: a guess, counted.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from eyas.records import GenerationRecord
from eyas.tokenize.checks import structural_flags
from eyas.tokenize.formats import Format, Markup, Piece, PlanError

MAX_WHITESPACE_DELTA = 4
WHITESPACE = ("\n", " ", "\n\n")
# Around the think tags first: that is where thinking models put whitespace ("…\n</think>\n\n…").
EDGES = (("reasoning", "trail"), ("content", "lead"), ("reasoning", "lead"), ("content", "trail"))
SEAM_HEAD_CHARS = 16
"""Model text looked at across a seam: pre-tokenization is local, so a seam that changes the
split changes it within the first pre-token."""
SEAM_TAIL_CHARS = 256
PROMPT_END_CHARS = 32
"""Enough of the prompt's end to see whether the template already opened the think block."""
AMBIGUOUS_WHITESPACE = "ambiguous-whitespace"
"""Flag: other whitespace restorations matched billing as well, with other ids."""


@dataclass
class Sample:
    """One rebuilt record: prompt ids (loss 0) then completion ids (loss 1)."""

    record: GenerationRecord
    prompt_ids: list[int]
    completion_ids: list[int]
    flags: list[str] = field(default_factory=list)

    @property
    def billed(self) -> int | None:
        """Billed completion tokens; 0 means the server reported none."""
        return self.record.usage.completion_tokens or None


@dataclass
class Dropped:
    id: str
    reason: str


def normalize(pieces: Sequence[Piece]) -> list[Piece]:
    """Join adjacent model text (the real stream has no seam there) and drop empty strings."""
    out: list[Piece] = []
    for p in pieces:
        if isinstance(p, str) and not p:
            continue
        if out and type(p) is str and type(out[-1]) is str:
            out[-1] += p
        else:
            out.append(p)
    return out


def whitespace_flag(segment: str, side: str, ws: str) -> str:
    """The flag naming whitespace restored at one edge, e.g. ``whitespace:content.lead='\\n\\n'``."""
    return f"whitespace:{segment}.{side}={ws!r}"


def _changes(flags: list[str]) -> tuple[tuple[str, ...], int]:
    """What a reading changes, its whitespace counted but not placed: readings equal here differ
    only in where whitespace went (and which)."""
    other = tuple(f for f in flags if not f.startswith("whitespace:"))
    return other, len(flags) - len(other)


class Rebuilder:
    """Rebuilds chunks of records in one format; holds no state between chunks."""

    def __init__(self, fmt: Format, stop_strings: bool = False):
        self.fmt = fmt
        self.encoder = fmt.encoder
        # Only when generation had stop strings (`generate.stop`) may a `stop` turn lack its end of turn.
        self.stop_strings = stop_strings

    def rebuild(self, records: Sequence[GenerationRecord]) -> tuple[list[Sample], list[Dropped]]:
        planned, dropped = [], []
        for r, prompt in zip(records, self.fmt.prompts(list(records))):
            try:
                if isinstance(prompt, PlanError):
                    raise prompt
                prompt = normalize(prompt)
                end = self.prompt_end(prompt)
                completion = normalize(self.fmt.completion(r, end, r.reasoning or "", r.content or ""))
            except PlanError as e:
                dropped.append(Dropped(r.id, f"cannot lay out in format {self.fmt.name}: {e}"))
                continue
            planned.append((r, prompt, completion, end))
        ids, leaks = self.encode([p for _, p, _, _ in planned] + [c for _, _, c, _ in planned])
        n = len(planned)
        samples = []
        for i, (r, prompt, completion, _) in enumerate(planned):
            sample = Sample(r, ids[i], ids[n + i])
            if leaks[n + i]:
                sample.flags.append("special-in-text")
            samples.append(sample)
        self.match_billing([(s, end) for s, (_, _, _, end) in zip(samples, planned)])
        self.check_seams(samples, [p for _, p, _, _ in planned], [c for _, _, c, _ in planned])
        for s in samples:
            s.flags += structural_flags(self.fmt, s.record, s.completion_ids, "stop-string" in s.flags)
        return samples, dropped

    def prompt_end(self, prompt: list[Piece]) -> str:
        """The prompt's last characters (a special id as its string): does it end with ``<think>``?"""
        if not prompt:
            return ""
        last = prompt[-1]
        return self.encoder.token_str(last) if isinstance(last, int) else last[-PROMPT_END_CHARS:]

    def encode(self, seqs: Sequence[list[Piece]]) -> tuple[list[list[int]], list[bool]]:
        """Ids of each piece list, and whether a special id came out of model text (it must not)."""
        texts = [p for seq in seqs for p in seq if type(p) is str]
        markup = [p for seq in seqs for p in seq if type(p) is Markup]
        text_ids = iter(self.encoder.encode_text(texts)) if texts else iter(())
        markup_ids = iter(self.encoder.encode_markup(markup)) if markup else iter(())
        specials = self.encoder.special_ids
        out, leaks = [], []
        for seq in seqs:
            ids: list[int] = []
            leak = False
            for p in seq:
                if type(p) is int:
                    ids.append(p)
                elif type(p) is Markup:
                    ids += next(markup_ids)
                else:
                    chunk = next(text_ids)
                    leak = leak or not specials.isdisjoint(chunk)
                    ids += chunk
            out.append(ids)
            leaks.append(leak)
        return out, leaks

    def match_billing(self, samples: list[tuple[Sample, str]]) -> None:
        """Retry samples off billing in their other readings; keep the first that matches, unless
        whitespace readings tie with it (:meth:`choose`)."""
        todo = [(s, end) for s, end in samples if s.billed is not None and len(s.completion_ids) != s.billed]
        if not todo:
            return
        owners, seqs, tags = [], [], []
        for s, end in todo:
            delta = abs(len(s.completion_ids) - s.billed)
            for flags, reasoning, content, as_specials in self.readings(s.record, delta):
                try:
                    seq = self.fmt.completion(s.record, end, reasoning, content, as_specials)
                except PlanError:
                    continue
                seq = normalize(seq)
                if flags or not as_specials:
                    owners.append(s)
                    seqs.append(seq)
                    tags.append(flags)
                if (
                    self.stop_strings
                    and s.record.finish_reason == "stop"
                    and seq
                    and seq[-1] == self.fmt.end_of_turn_id
                ):
                    # A configured stop string ends a turn without the end-of-turn token.
                    owners.append(s)
                    seqs.append(seq[:-1])
                    tags.append([*flags, "stop-string"])
        ids, leaks = self.encode(seqs)
        matches: dict[int, list[tuple[list[int], bool, list[str]]]] = {}
        for s, candidate, leak, flags in zip(owners, ids, leaks, tags):
            if len(candidate) == s.billed:
                matches.setdefault(id(s), []).append((candidate, leak, flags))
        for s, _ in todo:
            if id(s) not in matches:
                s.flags.append("billing-mismatch")
                continue
            s.completion_ids, leak, flags = self.choose(matches[id(s)])
            s.flags = [f for f in s.flags if f != "special-in-text"] + flags + (["special-in-text"] if leak else [])

    def choose(self, matches: list[tuple[list[int], bool, list[str]]]) -> tuple[list[int], bool, list[str]]:
        """Of the readings that match billing (in the order tried), the first; but when others differ
        from it only in where whitespace went and give other ids, billing cannot tell them apart: the
        one restoring most of the format's documented separators wins (the first tried among equals),
        flagged so the guess is counted rather than silent."""
        first = matches[0]
        ties = [m for m in matches if _changes(m[2]) == _changes(first[2])]
        if all(m[0] == first[0] for m in ties):
            return first
        documented = {whitespace_flag(segment, side, ws) for (segment, side), ws in self.fmt.separators.items()}
        ids, leak, flags = max(ties, key=lambda m: sum(f in documented for f in m[2]))  # max keeps the first
        return ids, leak, [*flags, AMBIGUOUS_WHITESPACE]

    def readings(self, record: GenerationRecord, delta: int) -> list[tuple[list[str], str, str, bool]]:
        """(flags, reasoning, content, markers-as-specials) to try, fewest changes first; the first is
        the default reading, tried again only without its end of turn."""
        reasoning, content = record.reasoning or "", record.content or ""
        modes = [(True, [])]
        if self.fmt.has_markers(content) or self.fmt.has_markers(reasoning):
            modes.append((False, ["markers-as-text"]))
        edges = [e for e in EDGES if e[0] == "content" or self.fmt.think_open is not None]
        # Records with sampled ids come from the local backend, which never strips: a count off
        # there is a non-canonical merge, and "restoring" whitespace would only hide it.
        max_edges = 2 if delta <= MAX_WHITESPACE_DELTA and record.token_ids is None else 0
        out = []
        for k in range(max_edges + 1):
            for chosen in itertools.combinations(edges, k):
                for spaces in itertools.product(WHITESPACE, repeat=k):
                    for as_specials, mode_flags in modes:
                        texts = {"reasoning": reasoning, "content": content}
                        flags = list(mode_flags)
                        for (segment, side), ws in zip(chosen, spaces):
                            texts[segment] = ws + texts[segment] if side == "lead" else texts[segment] + ws
                            flags.append(whitespace_flag(segment, side, ws))
                        out.append((flags, texts["reasoning"], texts["content"], as_specials))
        return out

    def check_seams(self, samples: list[Sample], prompts: list[list[Piece]], completions: list[list[Piece]]) -> None:
        """Where template text meets model text with no special between, joint and separate encoding must agree."""
        checks = []
        for s, prompt, completion in zip(samples, prompts, completions):
            if not prompt or not completion or isinstance(prompt[-1], int) or isinstance(completion[0], int):
                continue
            tail = prompt[-1][-SEAM_TAIL_CHARS:]
            if type(prompt[-1]) is Markup and self.fmt.added_pattern is not None:
                cut = [m.end() for m in self.fmt.added_pattern.finditer(tail)]
                tail = tail[cut[-1] :] if cut else tail
            head = completion[0][:SEAM_HEAD_CHARS]
            if tail and head:
                checks.append((s, tail, head))
        if not checks:
            return
        # Templates end their prompts with few distinct tails ("assistant\n"): encode each once.
        tails = sorted({t for _, t, _ in checks})
        ids = self.encoder.encode_text([t + h for _, t, h in checks] + [h for _, _, h in checks] + tails)
        n = len(checks)
        tail_ids = dict(zip(tails, ids[2 * n :]))
        for i, (s, tail, _) in enumerate(checks):
            if ids[i] != tail_ids[tail] + ids[n + i]:
                s.flags.append("seam-differs")
