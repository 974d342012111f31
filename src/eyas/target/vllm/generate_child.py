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
import os
import sys


def main(settings_path: str, result_fd: int) -> None:
    # 1 GiB of KV cache serves a small target on CPU; vLLM's default (4 GiB) is set aside whole.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    settings = json.loads(open(settings_path).read())
    llm = LLM(
        model=settings["target"],
        revision=settings["revision"],
        trust_remote_code=settings["trust_remote_code"],
        dtype=settings["dtype"],
        enforce_eager=True,
        tensor_parallel_size=settings["tensor_parallel_size"],
        seed=settings["seed"],
    )
    results = os.fdopen(result_fd, "w")
    results.write(json.dumps({"ready": True, "vllm_version": __import__("vllm").__version__}) + "\n")
    results.flush()
    for line in sys.stdin:
        batch = json.loads(line)
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
        results.write(json.dumps({"outputs": [list(o.outputs[0].token_ids) for o in outputs]}) + "\n")
        results.flush()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
