"""Captures prefill hidden states with vLLM for ``extract.engine: vllm``; a script, not a module.

``python extract_child.py SETTINGS.json RESULT_FD`` under an interpreter that has vLLM (it
imports nothing from eyas). The engine starts once and says so on ``RESULT_FD``
(``{"ready": true, ...}``); then each line on stdin is a batch (``{"samples": [[ids]]}``)
and each line written to ``RESULT_FD`` names, in order, the safetensors file holding each
sample's states (``{"paths": [...]}``), written completely.

Why this path: vLLM's ``extract_hidden_states`` speculative method is its supported way to
hand out hidden states (the one vllm-project/speculators uses). The "drafter" only caches
the states of ``eagle_aux_hidden_state_layer_ids`` beside the KV cache; the hidden-states
connector writes them per request when it finishes. The ids are vLLM's: id ``i`` is the
input of decoder layer ``i`` (= the output of layer ``i - 1``), and id ``L`` is the last
layer's output *before* the final norm, which eyas applies itself. Each prompt runs one
prefill and samples one token (required by the method; discarded). The states are the
residual stream, replicated across tensor-parallel ranks; rank 0 writes them.
"""

from __future__ import annotations

import fcntl
import json
import sys

from eyas_child import answer_requests, load_llm


def wait_until_written(path: str) -> None:
    """The connector holds an exclusive lock on ``<path>.lock`` until the file is complete."""
    with open(path + ".lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)


def main(settings_path: str, result_fd: int) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    settings = json.loads(open(settings_path).read())
    llm = load_llm(
        settings,
        tensor_parallel_size=settings["tensor_parallel_size"],
        pipeline_parallel_size=settings["pipeline_parallel_size"],
        enable_expert_parallel=settings["expert_parallel"],
        max_model_len=settings["max_model_len"],
        # Prefill only: CUDA graphs serve decoding, which this never does.
        enforce_eager=True,
        speculative_config={
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": settings["layer_ids"]}},
        },
        kv_transfer_config={
            "kv_connector": "HiddenStatesConnector",
            "kv_connector_module_path": "hidden_states_connector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": settings["staging_dir"]},
        },
    )
    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)

    def capture(request: dict) -> dict:
        prompts = [TokensPrompt(prompt_token_ids=ids) for ids in request["samples"]]
        paths = [out.kv_transfer_params["hidden_states_path"] for out in llm.generate(prompts, params, use_tqdm=False)]
        for path in paths:
            wait_until_written(path)
        return {"paths": paths}

    answer_requests(result_fd, capture)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
