import logging

import pytest
import torch

from eyas.target.capture import (
    capture,
    check_aux_layers,
    default_aux_layers,
    hf_hidden_state_indices,
    num_decoder_layers,
)


def test_default_layers_follow_the_documented_convention():
    assert default_aux_layers(30) == [1, 14, 26]
    assert hf_hidden_state_indices(default_aux_layers(32)) == [2, 16, 29]  # Llama-3.1-8B per SGLang/vLLM


def test_captured_states_equal_output_hidden_states_at_documented_indices(model, tokenizer):
    ids = tokenizer(["The capital of France is", "One two three four five six"], return_tensors="pt", padding=True)
    layers = default_aux_layers(num_decoder_layers(model))
    got = capture(model, ids.input_ids, ids.attention_mask, layers)
    with torch.inference_mode():
        ref = model(**ids, output_hidden_states=True).hidden_states
    hidden = model.config.hidden_size
    for k, hf_index in enumerate(hf_hidden_state_indices(layers)):
        torch.testing.assert_close(got.aux[..., k * hidden : (k + 1) * hidden], ref[hf_index])
    # transformers replaces the last entry with the normed output: that is what lm_head consumes.
    torch.testing.assert_close(got.final, ref[-1])
    torch.testing.assert_close(model.lm_head(got.final), model(**ids).logits)


@pytest.mark.parametrize(
    "layers, reason",
    [
        ([3, 1, 2], "strictly ascending"),
        ([1, 1, 2], "strictly ascending"),
        ([1, 14, 29], r"0\.\.28 for a 30-layer target.*the last layer has no next"),
        ([-1, 14, 26], r"0\.\.28"),
        ([1, 14], "exactly 3"),
    ],
)
def test_layers_a_server_cannot_feed_are_refused_with_the_reason(layers, reason):
    with pytest.raises(ValueError, match=reason):
        check_aux_layers(layers, 30)


def test_a_first_layer_other_than_one_warns_about_sglang(caplog):
    with caplog.at_level(logging.WARNING):
        assert check_aux_layers([1, 14, 28], 30) == [1, 14, 28]
        assert not caplog.records
        check_aux_layers([0, 14, 26], 30)
    assert "SGLang" in caplog.text
