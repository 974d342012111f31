"""Stand-ins for vLLM's interpreter: vLLM is an external service, so tests that need it to fail,
hang or echo what eyas sent point ``target.vllm_python`` at one of these scripts."""

from __future__ import annotations

import sys
from pathlib import Path

READY = "os.write(int(sys.argv[3]), b'{\"ready\": true}\\n')"
EXITS = 'print("stand-in: vllm is not here", flush=True)\nsys.exit(3)'
HANGS = 'print(subprocess.Popen(["sleep", "600"]).pid, flush=True)\ntime.sleep(600)'
"""Never answers; its own child stands for vLLM's engine process, which must be stopped too."""
HANGS_AFTER_READY = f"{READY}\ntime.sleep(600)"
SHORT = "STAND_IN_SHORT"
"""Set to 1, the two stand-ins below return one result fewer than they were sent."""
ANSWERS = f"""settings = json.load(open(sys.argv[2]))
print(json.dumps(settings), flush=True)
answers = os.fdopen(int(sys.argv[3]), "w")
answers.write('{{"ready": true}}\\n')
answers.flush()
for line in sys.stdin:
    n = len(json.loads(line)["prompts"]) - int(os.environ.get("{SHORT}", 0))
    answers.write(json.dumps({{"outputs": [settings["stop_token_ids"]] * n}}) + "\\n")
    answers.flush()
"""
"""A generate child: logs its settings, answers each prompt with the stop token."""
EVAL = f"""request = json.load(open(sys.argv[2]))
n = len(request["prompts"]) - int(os.environ.get("{SHORT}", 0))
result = {{"vllm_version": "stand-in", "outputs": [[1]] * n, "finish_reasons": ["stop"] * n, "counters": {{}},
          "load_seconds": 0.0, "generate_seconds": 0.0, "request": request}}
open(sys.argv[3], "w").write(json.dumps(result))
"""
"""An eval child: its result echoes the request."""


def stand_in(directory: Path, body: str) -> str:
    """An executable eyas runs as vLLM's python; it gets the child script's arguments and runs ``body``."""
    path = directory / "stand-in-python"
    path.write_text(f"#!{sys.executable}\nimport json, os, subprocess, sys, time\n{body}\n")
    path.chmod(0o755)
    return str(path)
