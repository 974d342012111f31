"""Generates batches with vLLM for eyas's ``generate.backend: vllm``; a script, not a module.

``python generate_child.py SETTINGS.json RESULT_FD`` under an interpreter that has vLLM (it
imports nothing from eyas; see :mod:`eyas.target.vllm`). The engine starts once and says so
on ``RESULT_FD`` (``{"ready": true, ...}``); then each line on stdin is a batch
(``{"prompts": [[ids]], "seeds": [...], "max_tokens": N}``) and each line written to
``RESULT_FD`` is its answer (``{"outputs": [[ids]]}``), generated ids with the stop token
included. Results go to their own descriptor because vLLM logs to
stdout. vLLM batches the prompts itself (continuous batching).
"""

from __future__ import annotations

import json
import sys

from eyas_child import answer_requests, load_llm


def main(settings_path: str, result_fd: int) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    settings = json.loads(open(settings_path).read())
    llm = load_llm(
        settings, enforce_eager=True, tensor_parallel_size=settings["tensor_parallel_size"], seed=settings["seed"]
    )

    def generate(batch: dict) -> dict:
        params = [
            SamplingParams(
                temperature=settings["temperature"],
                top_p=settings["top_p"],
                max_tokens=batch["max_tokens"],
                stop_token_ids=settings["stop_token_ids"],
                stop=settings["stop"] or None,
                include_stop_str_in_output=True,
                seed=seed if settings["temperature"] > 0 else None,
                detokenize=bool(settings["stop"]),
            )
            for seed in batch["seeds"]
        ]
        outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in batch["prompts"]], params, use_tqdm=False)
        return {"outputs": [list(o.outputs[0].token_ids) for o in outputs]}

    answer_requests(result_fd, generate)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
