"""The target in vLLM, eyas's side: generation and prefill capture through vLLM's ``LLM`` class.

For targets larger than one device (tensor, expert and pipeline parallelism are vLLM's) and
for throughput: vLLM batches continuously. vLLM runs in a child process in its own
environment (:mod:`eyas.target.vllm`), started once per stage run; these classes give the
stages the same interfaces as the transformers engine (:mod:`eyas.target.engines`).

Each child is told what share of the GPU's memory it may take, measured as it starts
(:func:`gpu_memory_utilization`): vLLM sets aside a fixed share of the whole device (0.9) and
refuses to start when less is free, as when eyas's own eval has just used the device.
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

from eyas.config import TargetConfig
from eyas.records import content_hash
from eyas.stage import file_digest
from eyas.target.capture import hf_hidden_state_indices
from eyas.target.children import stop_group
from eyas.target.generation import ChatCodec, Completion
from eyas.target.settings import PrefillCapture, Sampling, ServedTarget, SpeculativeDecoding
from eyas.target.vllm import VllmChild, VllmError, child_script, exited, start_vllm, timed_out

log = logging.getLogger(__name__)

VLLM_DEFAULT_SHARE = 0.9
"""vLLM's own ``gpu_memory_utilization``: what it takes of a free device."""
HEADROOM_BYTES = 2 << 30
"""Kept free beyond what vLLM may take: the child's own CUDA context (made after eyas measured)
and allocator slack, which vLLM's start-up check counts as used."""


def gpu_memory_utilization(free_bytes: int, total_bytes: int) -> float:
    """The share of the device's memory vLLM may take when ``free_bytes`` of ``total_bytes`` are
    free: vLLM's default on a free device, else what is free less ``HEADROOM_BYTES``."""
    share = min(VLLM_DEFAULT_SHARE, (free_bytes - HEADROOM_BYTES) / total_bytes)
    if share <= 0:
        raise VllmError(
            f"only {free_bytes / 2**30:.1f} of the GPU's {total_bytes / 2**30:.1f} GiB are free; "
            "vLLM cannot start there (another process holds the rest)"
        )
    return share


def device_memory() -> tuple[int, int] | None:
    """Free and total bytes of the current CUDA device; None without CUDA."""
    return torch.cuda.mem_get_info() if torch.cuda.is_available() else None


def _memory_settings() -> dict:
    """``gpu_memory_utilization`` for a child starting now (nothing on the CPU: vLLM's own sizing)."""
    memory = device_memory()
    return {"gpu_memory_utilization": gpu_memory_utilization(*memory)} if memory else {}


class VllmGenerator(ChatCodec):
    """``generate.backend: vllm``: batches sent to one long-lived vLLM child (``generate_child.py``).

    The same records as the transformers generator; ``token_ids`` are vLLM's own sampled ids.
    A context manager that stops the child.
    """

    def __init__(
        self, target: TargetConfig, sampling: Sampling, tokenizer, end_of_turn: int, stop_ids: set[int], log_path: Path
    ):
        super().__init__(tokenizer, end_of_turn, sampling)
        served = ServedTarget.of(target)
        settings = {
            **served.load_settings(),
            **_memory_settings(),
            "tensor_parallel_size": sampling.tensor_parallel_size,
            "seed": sampling.seed,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "stop": list(sampling.stop),
            "stop_token_ids": sorted(stop_ids),
        }
        self._child = VllmChild("generate", served.python, settings, log_path, served.timeout_s)

    def generate_batch(
        self, prompts: Sequence[list[int]], seed: int, max_tokens: int | None = None
    ) -> list[Completion]:
        limit = max_tokens or self.settings.max_tokens
        request = {
            "prompts": [list(p) for p in prompts],
            "seeds": [seed + i for i in range(len(prompts))],
            "max_tokens": limit,
        }
        outputs = self._child.results(request, "outputs", len(prompts))
        return [self._completion(ids, len(p), limit) for ids, p in zip(outputs, prompts, strict=True)]

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
    checks its token ids, and applies the target's own final norm. A context manager; its
    staging folder is removed on close, and when the child fails to start.
    """

    def __init__(
        self,
        target: TargetConfig,
        capture: PrefillCapture,
        aux_layers: list[int],
        num_layers: int,
        max_len: int,
        staging_dir: Path,
        log_path: Path,
    ):
        from eyas.target import load_final_norm

        served = ServedTarget.of(target)
        # The norm runs in the dtype vLLM hands the states out in.
        self._norm = load_final_norm(target, getattr(torch, served.dtype))
        # Files left by a killed run belong to samples that are captured again. Each run stages
        # in a folder of its own: vLLM names files by request id, which restarts with every engine.
        for stale in staging_dir.parent.glob(staging_dir.name + "-*"):
            shutil.rmtree(stale, ignore_errors=True)
        self._staging_dir = Path(tempfile.mkdtemp(prefix=staging_dir.name + "-", dir=staging_dir.parent))
        settings = {
            **served.load_settings(),
            **_memory_settings(),
            "tensor_parallel_size": capture.tensor_parallel_size,
            "pipeline_parallel_size": capture.pipeline_parallel_size,
            "expert_parallel": capture.expert_parallel,
            # One sampled token (discarded) follows each prompt.
            "max_model_len": max_len + 1,
            # vLLM's ids number the inputs of layers, as HF's hidden_states do; L is the last output.
            "layer_ids": hf_hidden_state_indices(aux_layers) + [num_layers],
            "staging_dir": str(self._staging_dir.resolve()),
        }
        try:
            self._child = VllmChild("extract", served.python, settings, log_path, served.timeout_s)
        except BaseException:
            shutil.rmtree(self._staging_dir, ignore_errors=True)
            raise

    def capture(self, samples: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        from safetensors.torch import load_file

        captured = []
        paths = self._child.results({"samples": samples}, "paths", len(samples))
        for ids, path in zip(samples, paths, strict=True):
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
    target: TargetConfig,
    decoding: SpeculativeDecoding,
    draft_dir: Path | None,
    prompts: list[list[int]],
    stop_ids: set[int],
    dtype: str,
    out_dir: Path,
    method: str | None = None,
) -> dict:
    """vLLM's outputs and its own spec-decode counters for ``prompts``, with ``draft_dir`` as
    drafter (None: plain decoding, no counters) by vLLM's speculative ``method`` (the drafter's
    family's :attr:`~eyas.drafter.family.Family.vllm_method`), the target in ``dtype``.

    Runs ``eval_child.py`` once, in ``out_dir``, stopped after ``target.engine_timeout_s``. The
    result is cached in ``out_dir/vllm-<request hash>.json``: a rerun with the same export,
    prompts and settings does not start vLLM again. ``result_file`` in the result names that
    file, so the report that uses it can keep it and drop the others.
    """
    served = ServedTarget.of(target, dtype)
    request = {
        **served.load_settings(),
        "draft": str(draft_dir.resolve()) if draft_dir else None,
        "method": method if draft_dir else None,
        # The drafter by content: a retrained one at the same path never reuses a cached result.
        "draft_files": [[p.name, file_digest(p)] for p in sorted(draft_dir.iterdir()) if p.is_file()]
        if draft_dir
        else [],
        "seed": decoding.seed,
        # CUDA graphs are captured for batch sizes a short eval never uses; eager is faster to start.
        "enforce_eager": True,
        "tensor_parallel_size": decoding.tensor_parallel_size,
        "num_speculative_tokens": decoding.num_draft_tokens,
        "temperature": decoding.temperature,
        "max_tokens": decoding.max_new_tokens,
        "stop_token_ids": sorted(stop_ids),
        "prompts": prompts,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    result_path = out_dir / f"vllm-{content_hash(request)}.json"
    if not result_path.is_file():
        # The memory share is measured now and left out of the hash: it changes nothing vLLM outputs.
        _run_eval_child(served, {**request, **_memory_settings()}, result_path, draft_dir)
    result = json.loads(result_path.read_text())
    if len(result["outputs"]) != len(prompts):
        raise VllmError(
            f"vLLM (eval) returned {len(result['outputs'])} outputs for {len(prompts)} prompts in {result_path}"
        )
    return {**result, "result_file": result_path.name}


def _run_eval_child(served: ServedTarget, request: dict, result_path: Path, draft_dir: Path | None) -> None:
    """Run ``eval_child.py`` until it has written ``result_path``; nothing else stays behind."""
    out_dir = result_path.parent
    request_path = result_path.with_suffix(".request.json")
    request_path.write_text(json.dumps(request))
    log_path = out_dir / "vllm.log"
    what = draft_dir or "plain decoding (no drafter)"
    log.info("eval: running %s in vLLM (%s); its log is %s", what, served.python, log_path)
    try:
        with log_path.open("w") as log_file:
            process = start_vllm(
                [served.python, child_script("eval"), str(request_path), str(result_path)], log_file, cwd=out_dir
            )
            try:
                returncode = process.wait(timeout=served.timeout_s)
            except subprocess.TimeoutExpired:
                raise timed_out("eval", served.timeout_s, log_path) from None
            finally:
                # However the child ended, nothing vLLM started under it outlives it.
                stop_group(process)
    finally:
        request_path.unlink(missing_ok=True)
        result_path.with_name(result_path.name + ".tmp").unlink(missing_ok=True)
    if returncode != 0 or not result_path.is_file():
        raise exited(f"eval, {what}", returncode, log_path)
