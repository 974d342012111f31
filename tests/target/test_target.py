import pytest

from eyas.config import ConfigError, TargetConfig
from eyas.target import end_of_turn_id, resolve_target


def test_embedded_target_converts_once_into_the_cache(target_config):
    source = resolve_target(target_config)
    assert source.is_local
    assert resolve_target(target_config) == source


def test_embedded_tokenizer_splits_digits_like_the_model(tokenizer):
    # The GGUF declares the `smollm` pre-tokenizer (digits split first); the model samples these pieces.
    pieces = [tokenizer.decode([i]) for i in tokenizer.encode(":\n\n1. 2024", add_special_tokens=False)]
    assert pieces == [":", "\n\n", "1", ".", " ", "2", "0", "2", "4"]


def test_chat_template_and_end_of_turn(tokenizer):
    assert end_of_turn_id(tokenizer) == 2
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_bad_target_paths_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="target.model: .*missing.gguf does not exist"):
        resolve_target(TargetConfig(model=str(tmp_path / "missing.gguf")))
    with pytest.raises(ConfigError, match="not a Hugging Face model directory"):
        resolve_target(TargetConfig(model=str(tmp_path)))
