"""The README written into an export: what it is and the commands that serve it."""

from __future__ import annotations

import json
from pathlib import Path


def serve_readme(format: str, directory: Path, target: str, steps: int) -> str:
    vllm_config = json.dumps({"method": "eagle3", "model": str(directory), "num_speculative_tokens": steps})
    sections = [
        f"# EAGLE-3 drafter for `{target}`\n\n"
        f"Trained by eyas; layout `{format}`. The token embedding is not included: servers share the target's.\n"
    ]
    if format == "speculators":
        # vLLM serves a speculators directory on its own: the verifier is named inside it.
        sections.append(f"## vLLM\n\n```bash\nvllm serve {directory}\n```\n")
    else:
        sections.append(
            "## SGLang\n\n```bash\n"
            f"python -m sglang.launch_server --model-path {target} \\\n"
            f"  --speculative-algorithm EAGLE3 --speculative-draft-model-path {directory} \\\n"
            f"  --speculative-num-steps {steps} --speculative-eagle-topk 1 --speculative-num-draft-tokens {steps + 1}\n```\n"
        )
        sections.append(f"## vLLM\n\n```bash\nvllm serve {target} --speculative-config '{vllm_config}'\n```\n")
    return "\n".join(sections)
