"""The target in vLLM, eyas's side: generation and prefill capture through vLLM's ``LLM`` class.

For targets larger than one device (tensor, expert and pipeline parallelism are vLLM's) and
for throughput: vLLM batches continuously. vLLM runs in a child process in its own
environment (:mod:`eyas.target.vllm`), started once per stage run; these classes give the
stages the same interfaces as the transformers engine (:mod:`eyas.target.engines`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from eyas.config import RunConfig
from eyas.records import content_hash
from eyas.target.capture import hf_hidden_state_indices
from eyas.target.generation import ChatCodec, Completion
from eyas.target.vllm import CHILD_PROCESS, VllmChild, VllmError, child_script, log_tail, stop_group, vllm_python

log = logging.getLogger(__name__)


class VllmGenerator(ChatCodec):
    """``generate.backend: vllm``: batches sent to one long-lived vLLM child (``generate_child.py``).

    The same records as the transformers generator; ``token_ids`` are vLLM's own sampled ids.
    A context manager that stops the child.
    """

    def __init__(self, config: RunConfig, tokenizer, end_of_turn: int, stop_ids: set[int], log_path: Path):
        super().__init__(tokenizer, end_of_turn, config.generate)
        g = config.generate
        settings = {
            **_served_target(config),
            "tensor_parallel_size": g.tensor_parallel_size,
            "seed": g.seed,
            "temperature": g.temperature,
            "top_p": g.top_p,
            "stop": g.stop,
            "stop_token_ids": sorted(stop_ids),
        }
        self._child = VllmChild("generate", vllm_python(config.target.vllm_python), settings, log_path)

    def generate_batch(
        self, prompts: Sequence[list[int]], seed: int, max_tokens: int | None = None
    ) -> list[Completion]:
        limit = max_tokens or self.settings.max_tokens
        request = {
            "prompts": [list(p) for p in prompts],
            "seeds": [seed + i for i in range(len(prompts))],
            "max_tokens": limit,
        }
        outputs = self._child.ask(request)["outputs"]
        return [self._completion(ids, len(p), limit) for ids, p in zip(outputs, prompts)]

    def close(self) -> None:
        self._child.close()

    def __enter__(self) -> VllmGenerator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class VllmPrefill:
    """``extract.engine: vllm``: the aux and final states of whole samples, captured by vLLM.

    ``extract_child.py`` returns one file per sample holding vLLM's states at the aux layers'
    outputs and the last layer's output before the final norm; this reads and deletes each,
    checks its token ids, and applies the target's own final norm. A context manager.
    """

    def __init__(
        self, config: RunConfig, aux_layers: list[int], num_layers: int, max_len: int, staging_dir: Path, log_path: Path
    ):
        from eyas.target import load_final_norm

        x, served = config.extract, _served_target(config)
        # The norm runs in the dtype vLLM hands the states out in.
        self._norm = load_final_norm(config.target, getattr(torch, served["dtype"]))
        # Files left by a killed run belong to samples that are captured again. Each run stages
        # in a folder of its own: vLLM names files by request id, which restarts with every engine.
        for stale in staging_dir.parent.glob(staging_dir.name + "-*"):
            shutil.rmtree(stale, ignore_errors=True)
        self._staging_dir = Path(tempfile.mkdtemp(prefix=staging_dir.name + "-", dir=staging_dir.parent))
        settings = {
            **served,
            "tensor_parallel_size": x.tensor_parallel_size,
            "pipeline_parallel_size": x.pipeline_parallel_size,
            "expert_parallel": x.expert_parallel,
            # One sampled token (discarded) follows each prompt.
            "max_model_len": max_len + 1,
            # vLLM's ids number the inputs of layers, as HF's hidden_states do; L is the last output.
            "layer_ids": hf_hidden_state_indices(aux_layers) + [num_layers],
            "staging_dir": str(self._staging_dir.resolve()),
        }
        self._child = VllmChild("extract", vllm_python(config.target.vllm_python), settings, log_path)

    def capture(self, samples: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        from safetensors.torch import load_file

        captured = []
        for ids, path in zip(samples, self._child.ask({"samples": samples})["paths"]):
            tensors = load_file(path)
            os.unlink(path)
            Path(path + ".lock").unlink(missing_ok=True)
            if tensors["token_ids"].tolist() != ids:
                raise VllmError(f"vLLM returned the states of other tokens than a sample's in {path}")
            states = tensors["hidden_states"]
            captured.append((states[:, :-1].flatten(1), self._norm(states[:, -1])))
        return captured

    def close(self) -> None:
        self._child.close()
        shutil.rmtree(self._staging_dir, ignore_errors=True)

    def __enter__(self) -> VllmPrefill:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def speculative_decode(
    config: RunConfig, draft_dir: Path | None, prompts: list[list[int]], stop_ids: set[int], dtype: str, out_dir: Path
) -> dict:
    """vLLM's outputs and its own spec-decode counters for ``prompts``, with ``draft_dir`` as EAGLE-3
    drafter (None: plain decoding, no counters).

    Runs ``eval_child.py`` once under ``config.eval``'s settings. The result is cached in
    ``out_dir/vllm-<request hash>.json``: a rerun with the same export, prompts and settings
    does not start vLLM again.
    """
    cfg = config.eval
    request = {
        **_served_target(config),
        "draft": str(draft_dir.resolve()) if draft_dir else None,
        "draft_files": [
            [p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(draft_dir.iterdir()) if p.is_file()
        ]
        if draft_dir
        else [],
        # eyas's own eval ran the target in this dtype; vLLM must too for the outputs to match.
        "dtype": dtype,
        "seed": cfg.seed,
        # CUDA graphs are captured for batch sizes a short eval never uses; eager is faster to start.
        "enforce_eager": True,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "num_speculative_tokens": cfg.num_draft_tokens,
        "temperature": cfg.temperature,
        "max_tokens": cfg.max_new_tokens,
        "stop_token_ids": sorted(stop_ids),
        "prompts": prompts,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    result_path = out_dir / f"vllm-{content_hash(request)}.json"
    if result_path.is_file():
        return json.loads(result_path.read_text())
    request_path = result_path.with_suffix(".request.json")
    request_path.write_text(json.dumps(request))
    log_path = out_dir / "vllm.log"
    python = vllm_python(config.target.vllm_python)
    what = draft_dir or "plain decoding (no drafter)"
    log.info("eval: running %s in vLLM (%s); its log is %s", what, python, log_path)
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [python, child_script("eval"), str(request_path), str(result_path)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=out_dir,
            **CHILD_PROCESS,
        )
        try:
            returncode = process.wait()
        except BaseException:
            stop_group(process)
            raise
    request_path.unlink(missing_ok=True)
    if returncode != 0 or not result_path.is_file():
        raise VllmError(
            f"vLLM exited with {returncode} running {what}; last lines of {log_path}:\n{log_tail(log_path)}"
        )
    return json.loads(result_path.read_text())


def _served_target(config: RunConfig) -> dict:
    """The settings every vLLM child loads the target with."""
    from eyas.target import dtype_name, resolve_target

    source = resolve_target(config.target)
    return {
        "target": source.name_or_path,
        "revision": source.revision,
        "trust_remote_code": config.target.trust_remote_code,
        "dtype": dtype_name(config.target),
    }
