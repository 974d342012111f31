"""What the vLLM children share: taking vLLM down with them, the target loaded as eyas resolved it,
and the request loop. (Dying with eyas is asked for before the child starts, by
``eyas/target/die_with_eyas.py``.)

Imported by the ``*_child.py`` scripts beside it (their folder is first on ``sys.path``); like
them it imports nothing from eyas.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
from collections.abc import Callable


def _stop_the_group(_signum, _frame) -> None:
    """eyas died or asked to stop: take vLLM's engine and workers down too (they outlive us)."""
    os.killpg(0, signal.SIGKILL)


if os.getpgid(0) == os.getpid():
    # Only as a group leader (eyas starts its children so): the group is then ours alone.
    signal.signal(signal.SIGTERM, _stop_the_group)


def load_llm(settings: dict, **engine_args):
    """vLLM's ``LLM`` with the target of ``settings`` (model, revision, remote code, dtype, and
    the share of the GPU's memory it may take when eyas measured one) and the child's own engine
    arguments."""
    # 1 GiB of KV cache serves a small target on CPU; vLLM's default (4 GiB) is set aside whole.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    if settings.get("gpu_memory_utilization") is not None:
        engine_args["gpu_memory_utilization"] = settings["gpu_memory_utilization"]
    return LLM(
        model=settings["target"],
        revision=settings["revision"],
        trust_remote_code=settings["trust_remote_code"],
        dtype=settings["dtype"],
        **engine_args,
    )


def answer_requests(result_fd: int, answer: Callable[[dict], dict]) -> None:
    """Say the engine is ready on ``result_fd``, then answer each JSON line of stdin there, in order."""
    import vllm

    results = os.fdopen(result_fd, "w")
    ready = {"ready": True, "vllm_version": vllm.__version__}
    for reply in itertools.chain([ready], (answer(json.loads(line)) for line in sys.stdin)):
        results.write(json.dumps(reply) + "\n")
        results.flush()
