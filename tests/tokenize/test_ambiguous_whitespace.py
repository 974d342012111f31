"""Whitespace readings that tie on billing: the format's documented separator wins, flagged and counted.

deepseek-r1 on the SmolLM2 BPE with R1's specials (as in test_formats) and the pre-tokenizer of
R1-Distill-Qwen (Qwen2's regex, where ``\\n\\n`` before a word is one pre-token): there a stripped
``\\n\\n`` after ``</think>`` and a space ending the reasoning are one token each, so billing
cannot tell them apart.
"""

from dataclasses import replace

import pytest
from tokenizers import Regex, pre_tokenizers

from eyas.records import Usage
from eyas.tokenize.encoders import HFEncoder
from eyas.tokenize.formats import FORMATS
from eyas.tokenize.rebuild import Rebuilder
from eyas.tokenize.report import DatasetReport, details
from tests.tokenize.test_formats import family_encoder, record

QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@pytest.fixture(scope="module")
def r1(target_config):
    tokenizer = family_encoder(target_config, "deepseek-r1").tokenizer
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    return Rebuilder(FORMATS["deepseek-r1"](HFEncoder(tokenizer)))


def rebuild_one(rebuilder, rec, billed=0):
    (sample,), dropped = rebuilder.rebuild([replace(rec, usage=Usage(completion_tokens=billed))])
    assert dropped == []
    return sample


def test_tied_whitespace_takes_the_documented_separator_and_is_flagged(r1):
    """The server kept the reasoning's newline but stripped `\\n\\n` from the answer's start."""
    truth = rebuild_one(r1, record("\n\nIt is 4.", "Add two and two.\n")).completion_ids
    space = rebuild_one(r1, record("It is 4.", "Add two and two.\n ")).completion_ids
    assert len(space) == len(truth) and space != truth  # the tie: tried first, billing alone would keep it
    sample = rebuild_one(r1, record("It is 4.", "Add two and two.\n"), billed=len(truth))
    assert sample.completion_ids == truth
    assert sample.flags == ["whitespace:content.lead='\\n\\n'", "ambiguous-whitespace"]

    report = DatasetReport("r1", "deepseek-r1")
    report.add(sample, kept=True)
    report.add(rebuild_one(r1, record("It is 4.", "Add two and two.")), kept=True)
    assert report.to_dict()["flags"] == {"whitespace:content.lead='\\n\\n'": 1, "ambiguous-whitespace": 1}
    assert (
        "r1: ambiguous-whitespace on 1 samples: whitespace restored at other edges matched billing as well; "
        "the format's documented separator was kept (else the first tried)" in details(report)
    )


def test_a_single_matching_reading_is_not_flagged(target_config):
    """On SmolLM2's own pre-tokenizer `\\n\\n` before a word is two tokens: only the answer's start
    takes two with one edge (both ends already hold a newline the restored whitespace merges with,
    and before the reasoning's opening space `\\n\\n` stays one pre-token)."""
    encoder = family_encoder(target_config, "deepseek-r1")
    rebuilder = Rebuilder(FORMATS["deepseek-r1"](encoder))
    truth = rebuild_one(rebuilder, record("\n\nIt is 4.\n", " Add two and two.\n")).completion_ids
    sample = rebuild_one(rebuilder, record("It is 4.\n", " Add two and two.\n"), billed=len(truth))
    assert sample.completion_ids == truth
    assert sample.flags == ["whitespace:content.lead='\\n\\n'"]
    report = DatasetReport("r1", "deepseek-r1")
    report.add(sample, kept=True)
    assert not any("ambiguous-whitespace" in line for line in details(report))
