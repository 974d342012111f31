"""The vLLM backend (``generate.backend: vllm``): the target served by vLLM's ``LLM`` class.

For targets that run on the user's own GPUs (``generate.tensor_parallel_size``) and for
throughput: vLLM batches continuously, so a long answer does not hold a whole batch back.
It produces the same records as the local backend, through the same job loop, resume and
settings guard; ``token_ids`` are vLLM's own sampled ids. vLLM runs in a child process in
its own environment (:mod:`eyas.vllm_process`), started once per ``eyas generate``.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from eyas.config import RunConfig
from eyas.generate.local import ChatCodec, Completion
from eyas.vllm_process import VllmError, log_tail, vllm_python

CHILD_SCRIPT = Path(__file__).with_name("vllm_child.py")


class VllmGenerator(ChatCodec):
    """Batches sent to one long-lived vLLM child; a context manager that stops it on exit."""

    def __init__(self, config: RunConfig, tokenizer, end_of_turn: int, stop_ids: set[int], dtype: str, log_path: Path):
        super().__init__(tokenizer, end_of_turn, config.generate)
        from eyas.target import resolve_target

        g = config.generate
        python = vllm_python(config.target.vllm_python)
        self._settings_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
        json.dump(
            {
                "target": resolve_target(config.target).name_or_path,
                "dtype": dtype,
                "tensor_parallel_size": g.tensor_parallel_size,
                "seed": g.seed,
                "temperature": g.temperature,
                "top_p": g.top_p,
                "stop": g.stop,
                "stop_token_ids": sorted(stop_ids),
            },
            self._settings_file,
        )
        self._settings_file.close()
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        read_fd, write_fd = os.pipe()
        with log_path.open("a") as log_file:
            self._process = subprocess.Popen(
                [python, str(CHILD_SCRIPT), self._settings_file.name, str(write_fd)],
                stdin=subprocess.PIPE, stdout=log_file, stderr=subprocess.STDOUT, pass_fds=(write_fd,), text=True,
            )
        os.close(write_fd)
        self._results = os.fdopen(read_fd)

    def generate_batch(self, prompts: Sequence[list[int]], seed: int, max_tokens: int | None = None) -> list[Completion]:
        limit = max_tokens or self.settings.max_tokens
        request = {"prompts": [list(p) for p in prompts], "seeds": [seed + i for i in range(len(prompts))], "max_tokens": limit}
        try:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            pass
        line = self._results.readline()
        if not line:
            self._process.wait()
            raise VllmError(f"vLLM exited with {self._process.returncode}; last lines of {self.log_path}:\n{log_tail(self.log_path)}")
        outputs = json.loads(line)["outputs"]
        return [self._completion(ids, len(p), limit) for ids, p in zip(outputs, prompts)]

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._results.close()
        os.unlink(self._settings_file.name)

    def __enter__(self) -> VllmGenerator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
