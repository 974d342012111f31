"""Two tokenizer back-ends behind one small interface, both batch-encoding in Rust.

Rebuilding ids needs two kinds of encoding: completion text with special-token parsing *off*
(a literal ``<|im_end|>`` written by the model stays text) and rendered chat-template markup
with parsing *on*. :class:`HFEncoder` wraps a Hugging Face fast tokenizer's Rust core (a
second copy with ``encode_special_tokens`` set does the text side); :class:`TiktokenEncoder`
wraps a ``tiktoken.Encoding`` (Kimi). Both encode whole batches across all cores.
"""

from __future__ import annotations

import os
import re
from typing import Any

from eyas.config import ConfigError


class PlanError(ValueError):
    """A record that cannot be laid out (a template error, an unknown role, bad tool calls):
    the sample is dropped with this reason."""


class HFEncoder:
    """A transformers tokenizer: its chat template renders prompts, its Rust core encodes."""

    def __init__(self, tokenizer: Any):
        from tokenizers import Tokenizer

        core = getattr(tokenizer, "backend_tokenizer", None)
        if core is None:
            raise ConfigError(
                "target.tokenizer: tokenize needs a fast (Rust) tokenizer; "
                f"{type(tokenizer).__name__} has none (for Kimi use tokenize.format kimi-k2.5)"
            )
        self.tokenizer = tokenizer
        self._markup = core
        self._text = Tokenizer.from_str(core.to_str())
        self._text.encode_special_tokens = True
        added = tokenizer.added_tokens_decoder
        self.special_ids = frozenset(i for i, tok in added.items() if tok.special)
        self.added_tokens = tuple(tok.content for tok in added.values())
        self.chat_template = tokenizer.chat_template
        self._split = _added_token_splitter(added.values(), core)

    def encode_text(self, texts: list[str]) -> list[list[int]]:
        """Encode with special-token strings taken as plain text."""
        return [e.ids for e in self._text.encode_batch_fast(texts, add_special_tokens=False)]

    def encode_markup(self, texts: list[str]) -> list[list[int]]:
        """Encode rendered template text: special-token strings become their ids.

        Rendered prompts repeat the same template text (system prompt, role headers) in every
        sample. The Rust tokenizer splits at added tokens and encodes the spans between them
        independently, so doing that split here and encoding each distinct span once gives the
        same ids for less work.
        """
        if self._split is None:
            return [e.ids for e in self._markup.encode_batch_fast(texts, add_special_tokens=False)]
        token_ids = {t: self._markup.token_to_id(t) for t in self.added_tokens}
        parts = [self._split.split(t) for t in texts]
        spans = list({p for ps in parts for p in ps[::2] if p})
        span_ids = dict(zip(spans, self.encode_text(spans)))
        out = []
        for ps in parts:
            ids: list[int] = []
            for i, p in enumerate(ps):
                if i % 2:
                    ids.append(token_ids[p])
                elif p:
                    ids += span_ids[p]
            out.append(ids)
        return out

    def token_id(self, token: str) -> int | None:
        """Id of ``token`` when it is one whole token of the vocabulary, else None."""
        return self._markup.token_to_id(token)

    def token_str(self, token_id: int) -> str:
        return self._markup.decode([token_id], skip_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self._markup.decode(ids, skip_special_tokens=False)

    def render_chat(self, messages: list[dict], tools: list | None, add_generation_prompt: bool = True) -> str:
        return self.render_chats([messages], tools, add_generation_prompt)[0]

    def render_chats(
        self, conversations: list[list[dict]], tools: list | None, add_generation_prompt: bool = True
    ) -> list[str]:
        """Render several conversations that share ``tools`` in one template call."""
        if not self.chat_template:
            raise ConfigError("target.tokenizer: the tokenizer has no chat template to render prompts with")
        try:
            return self.tokenizer.apply_chat_template(
                conversations, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False
            )
        except Exception as e:  # jinja raises many types (raise_exception, undefined, type errors)
            raise PlanError(f"chat template: {e}") from None


def _added_token_splitter(added: Any, core: Any) -> re.Pattern | None:
    """A regex splitting text at added tokens the way the Rust tokenizer does, when that is exact.

    Added tokens that strip neighbouring spaces, match single words or are matched after
    normalization change the spans around them; with any of those, the Rust path is used.
    """
    tokens = list(added)
    if not tokens or core.normalizer is not None and any(t.normalized for t in tokens):
        return None
    if any(t.lstrip or t.rstrip or t.single_word for t in tokens):
        return None
    # Longest first: the Rust matcher takes the leftmost-longest added token.
    alternatives = sorted((t.content for t in tokens), key=len, reverse=True)
    return re.compile("(" + "|".join(map(re.escape, alternatives)) + ")")


class TiktokenEncoder:
    """A ``tiktoken.Encoding`` (Kimi's tokenizer): formats render their prompts themselves."""

    def __init__(self, encoding: Any):
        self.encoding = encoding
        self.special_ids = frozenset(encoding._special_tokens.values())
        self.added_tokens = tuple(encoding._special_tokens)
        self._threads = os.cpu_count() or 1

    def encode_text(self, texts: list[str]) -> list[list[int]]:
        return self.encoding.encode_ordinary_batch(texts, num_threads=self._threads)

    def encode_markup(self, texts: list[str]) -> list[list[int]]:
        return self.encoding.encode_batch(texts, num_threads=self._threads, allowed_special="all")

    def token_id(self, token: str) -> int | None:
        special = self.encoding._special_tokens.get(token)
        if special is not None:
            return special
        ids = self.encoding.encode_ordinary(token)
        return ids[0] if len(ids) == 1 else None

    def token_str(self, token_id: int) -> str:
        try:
            return self.encoding.decode_single_token_bytes(token_id).decode("utf-8", errors="replace")
        except KeyError:
            return f"<unknown id {token_id}>"

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(ids)
