"""The README written into an export: what it is and the commands that serve it."""

from __future__ import annotations

import json
from pathlib import Path


def serve_readme(format: str, directory: Path, target: str, steps: int) -> str:
    vllm_config = json.dumps({"method": "eagle3", "model": str(directory), "num_speculative_tokens": steps})
    return f"""# EAGLE-3 drafter for `{target}`

Trained by eyas; layout `{format}`. The token embedding is not included: servers share the target's.

## SGLang

```bash
python -m sglang.launch_server --model-path {target} \\
  --speculative-algorithm EAGLE3 --speculative-draft-model-path {directory} \\
  --speculative-num-steps {steps} --speculative-eagle-topk 1 --speculative-num-draft-tokens {steps + 1}
```

## vLLM

```bash
vllm serve {target} --speculative-config '{vllm_config}'
```
"""
