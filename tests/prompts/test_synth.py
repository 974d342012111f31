import pytest

from eyas.config import RunConfig
from eyas.jsonl import read_jsonl
from eyas.prompts.synth import synthesize, user_turn_opening


def test_user_turn_opening_ends_where_the_users_words_begin(tokenizer):
    opening = user_turn_opening(tokenizer, "cooking")
    assert opening.endswith("<|im_start|>user\n")
    assert "cooking" in opening


@pytest.mark.slow
def test_synthesized_prompts_are_unique_user_turns_and_top_up_on_rerun(tmp_path):
    out = tmp_path / "synth.jsonl"
    config = RunConfig(run_dir=str(tmp_path))
    assert synthesize(config, 2, out, quiet=True, batch_size=8, max_tokens=40) == 2
    rows = [row for _, row in read_jsonl(out)]
    assert len(rows) == 2
    texts = [r["messages"][0]["content"] for r in rows]
    assert len(set(texts)) == 2 and all(t.strip() == t and len(t) >= 8 for t in texts)
    assert all(r["messages"][0]["role"] == "user" and "<|im_end|>" not in r["messages"][0]["content"] for r in rows)
    assert synthesize(config, 3, out, quiet=True, batch_size=8, max_tokens=40) == 3
    assert [row for _, row in read_jsonl(out)][:2] == rows
