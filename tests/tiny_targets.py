"""Tiny random-weight targets of the architectures eyas is used with, built from transformers configs.

Each has five decoder layers (EAGLE-3's three aux layers must lie in 0..L-2; runs name
``[1, 2, 3]``), a 64-wide residual stream and the embedded target's tokenizer (SmolLM2's, which
llama.cpp's converter knows), so a whole run on one takes seconds. Weights are drawn with a wide
initializer (std 0.5) so greedy decoding rarely meets a near-tie, where llama.cpp's batched
verification may round onto the runner-up.
"""

from __future__ import annotations

from pathlib import Path

import torch

AUX_LAYERS = [1, 2, 3]
COMMON = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "initializer_range": 0.5,
    "tie_word_embeddings": True,
}
ARCHITECTURES = {
    "Llama": ("LlamaConfig", {}),
    "Qwen3": ("Qwen3Config", {}),
    "Qwen3-MoE": (
        "Qwen3MoeConfig",
        {"moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1},
    ),
    "DeepSeek-V3": (
        "DeepseekV3Config",
        {
            "num_key_value_heads": 4,
            "moe_intermediate_size": 32,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "kv_lora_rank": 16,
            "q_lora_rank": 32,
            "qk_rope_head_dim": 8,
            "head_dim": 8,  # transformers sizes DeepSeek's rotary embedding by head_dim: the rope part's
            "qk_nope_head_dim": 16,
            "v_head_dim": 16,
        },
    ),
    "Gemma-3": ("Gemma3TextConfig", {"sliding_window": 32}),
    "GPT-OSS": (
        "GptOssConfig",
        # llama.cpp's gpt-oss graph requires an output head of its own, as the real model has.
        {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 32, "tie_word_embeddings": False},
    ),
}
"""Name -> (transformers config class, settings beyond :data:`COMMON`)."""


def build_target(name: str, tokenizer, out: Path) -> Path:
    """The tiny ``name`` target (a key of :data:`ARCHITECTURES`), saved with ``tokenizer`` as a
    float32 Hugging Face directory at ``out``."""
    import transformers
    from transformers import AutoModelForCausalLM

    config_class, settings = ARCHITECTURES[name]
    config = getattr(transformers, config_class)(
        **{**COMMON, **settings},
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
