"""``tokenize.format: auto``: learn the assistant turn's layout from the chat template itself.

Probe conversations are rendered with and without the answer: the generation prompt must be
a prefix of the rendered conversation (a template that rewrites earlier text when the answer is
added is not prefix-stable, and is refused); what follows it up to the answer is the text the
model writes first, and the suffix must open with the special token that ends the turn. A
second probe with ``reasoning_content`` finds how reasoning is wrapped, when the template
renders it. Tool calls are left to the explicit formats.
"""

from __future__ import annotations

from dataclasses import dataclass

from eyas.config import ConfigError
from eyas.records import GenerationRecord
from eyas.tokenize.formats import Format, Piece, PlanError

QUESTION, ANSWER, THOUGHT = "eyas probe question", "eyas probe answer", "eyas probe reasoning"


@dataclass(frozen=True)
class Layout:
    end_of_turn: str
    answer_prefix: str
    """Template text between the generation prompt and the content."""
    reasoning_wrap: tuple[str, str] | None
    """Text before and after the reasoning, up to the content; None when not rendered."""


def probe(encoder) -> Layout:
    """The assistant turn's layout, or a ConfigError saying why the template cannot be used."""
    try:
        return _probe(encoder)
    except PlanError as e:
        raise ConfigError(f"tokenize.format auto: the chat template fails on a probe conversation ({e})") from None


def _probe(encoder) -> Layout:
    user = {"role": "user", "content": QUESTION}
    gen = encoder.render_chat([user], None, add_generation_prompt=True)
    plain = _after_prompt(encoder, gen, [user, {"role": "assistant", "content": ANSWER}])
    at = plain.find(ANSWER)
    if at < 0:
        raise ConfigError(
            "tokenize.format auto: the chat template does not render the assistant's answer; set tokenize.format"
        )
    suffix = plain[at + len(ANSWER) :]
    ends = [t for t in encoder.added_tokens if suffix.startswith(t)]
    if not ends:
        raise ConfigError(
            f"tokenize.format auto: the assistant turn ends with {suffix[:20]!r}, not a special token; set tokenize.format"
        )
    reasoning_wrap = None
    thought = {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}
    with_reasoning = _after_prompt(encoder, gen, [user, thought])
    r = with_reasoning.find(THOUGHT)
    a = with_reasoning.find(ANSWER)
    if 0 <= r < a:
        reasoning_wrap = (with_reasoning[:r], with_reasoning[r + len(THOUGHT) : a])
    return Layout(max(ends, key=len), plain[:at], reasoning_wrap)


def _after_prompt(encoder, gen: str, messages: list[dict]) -> str:
    full = encoder.render_chat(messages, None, add_generation_prompt=False)
    if not full.startswith(gen):
        raise ConfigError(
            "tokenize.format auto: the chat template is not prefix-stable (the conversation rendered with "
            "the answer does not start with the generation prompt), so the answer's ids cannot be separated; "
            "set tokenize.format explicitly"
        )
    return full[len(gen) :]


class AutoFormat(Format):
    """A format whose layout comes from :func:`probe`."""

    name = "auto"

    def __init__(self, encoder):
        self.layout = probe(encoder)
        self.end_of_turn = self.layout.end_of_turn
        super().__init__(encoder)

    def body(self, record: GenerationRecord, prompt_end, reasoning, content, markers_as_specials) -> list[Piece]:
        if record.tool_calls:
            raise PlanError("format auto does not place tool calls; set tokenize.format")
        if not reasoning:
            return [*self.template_text(self.layout.answer_prefix), content]
        if self.layout.reasoning_wrap is None:
            raise PlanError("the chat template does not render reasoning; set tokenize.format")
        before, after = (self.template_text(t) for t in self.layout.reasoning_wrap)
        if record.finish_reason == "length" and not content:
            return [*before, reasoning]
        return [*before, reasoning, *after, content]
