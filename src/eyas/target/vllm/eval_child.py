"""Runs an EAGLE-3 or DFlash export in vLLM and writes what vLLM itself measured; a script, not a module.

``python eval_child.py REQUEST.json RESULT.json`` under an interpreter that has vLLM
installed. It imports nothing from eyas: vLLM pins its own torch and transformers, so it
usually lives in an environment of its own (``make vllm`` builds ``.venv-vllm``), and eyas
starts this file there as a child process (:mod:`eyas.eval.vllm_engine`).

The request names the target directory, the drafter directory (null: plain decoding) and
vLLM's speculative method for it (``eagle3``, ``dflash``), the prompts as token ids, the sampling settings and, on a GPU, the share of its memory vLLM may
take; the result holds each prompt's generated ids and vLLM's own
speculative-decoding counters (``vllm:spec_decode_num_drafts``, ``..._num_accepted_tokens``,
``..._num_accepted_tokens_per_pos``), read from ``LLM.get_metrics()``: the numbers a server
shows on ``/metrics``, not a recount of ours.
"""

from __future__ import annotations

import json
import os
import sys
import time

from eyas_child import load_llm

METRIC_PREFIX = "vllm:spec_decode_"


def spec_decode_counters(metrics) -> dict:
    """vLLM's spec-decode counters by short name (``num_drafts``, ``num_accepted_tokens_per_pos``, ...)."""
    counters: dict = {}
    for metric in metrics:
        if not metric.name.startswith(METRIC_PREFIX):
            continue
        name = metric.name[len(METRIC_PREFIX) :]
        if hasattr(metric, "values"):
            previous = counters.get(name) or [0] * len(metric.values)
            counters[name] = [a + b for a, b in zip(previous, metric.values)]
        elif hasattr(metric, "value"):
            counters[name] = counters.get(name, 0) + metric.value
    return counters


def main(request_path: str, result_path: str) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    request = json.loads(open(request_path).read())
    started = time.perf_counter()
    llm = load_llm(
        request,
        seed=request["seed"],
        enforce_eager=request["enforce_eager"],
        tensor_parallel_size=request["tensor_parallel_size"],
        disable_log_stats=False,
        # No drafter: plain decoding, the baseline and lossless reference when eyas cannot run the target.
        speculative_config={
            "method": request["method"],
            "model": request["draft"],
            "num_speculative_tokens": request["num_speculative_tokens"],
        }
        if request["draft"]
        else None,
    )
    loaded = time.perf_counter()
    params = [
        SamplingParams(
            temperature=request["temperature"],
            max_tokens=request["max_tokens"],
            stop_token_ids=request["stop_token_ids"],
            seed=request["seed"] * 1_000_003 + index if request["temperature"] > 0 else None,
            detokenize=False,
        )
        for index in range(len(request["prompts"]))
    ]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in request["prompts"]], params, use_tqdm=False)
    finished = time.perf_counter()
    result = {
        "vllm_version": __import__("vllm").__version__,
        "outputs": [list(out.outputs[0].token_ids) for out in outputs],
        "finish_reasons": [out.outputs[0].finish_reason for out in outputs],
        "counters": spec_decode_counters(llm.get_metrics()),
        "load_seconds": loaded - started,
        "generate_seconds": finished - loaded,
    }
    with open(result_path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(result_path + ".tmp", result_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
