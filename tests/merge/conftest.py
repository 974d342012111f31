"""Two real tokenized datasets (the embedded model's own greedy answers), made once per session."""

from __future__ import annotations

import pytest

from tests.corpus import tokenized_rows


@pytest.fixture(scope="session")
def corpus_rows(tokenizer, model):
    return {name: tokenized_rows(tokenizer, model, name, max_new_tokens=8) for name in ("chat", "math")}
