"""``eyas demo``: the whole job on the embedded default, on CPU, with no network.

Writes a demo config (its sizes chosen so the run fits a 2-core laptop and stated in the
file), then runs each stage that exists. Every stage resumes, so rerunning continues.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from eyas.config import load_config
from eyas.console import console, setup_logging
from eyas.paths import RunPaths

DEMO_PROMPTS = 32


def demo_config(run_dir: Path) -> dict:
    return {
        "run_dir": ".",
        "target": {"model": "embedded"},
        "datasets": [{"name": "synth", "source": "prompts/synth.jsonl"}],
        "generate": {"backend": "local", "max_tokens": 96, "temperature": 0.0, "batch_size": 16},
    }


def write_demo_config(run_dir: Path) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "demo.yaml"
    header = (
        f"# eyas demo on the embedded SmolLM2-135M-Instruct, sized for 2 CPU cores:\n"
        f"# {DEMO_PROMPTS} synthesized prompts, greedy answers of at most 96 tokens.\n"
    )
    path.write_text(header + yaml.safe_dump(demo_config(run_dir), sort_keys=False))
    return path


def run_demo(run_dir: Path, quiet: bool = False) -> None:
    from eyas import generate
    from eyas.generate.status import collect, table
    from eyas.prompts.synth import synthesize

    config_path = write_demo_config(run_dir)
    config = load_config(config_path)
    setup_logging(RunPaths.of(config).log_file, quiet)
    console.rule("1. prompts: synthesize from the target")
    synthesize(config, DEMO_PROMPTS, Path(config.datasets[0].source), quiet)
    console.rule("2. generate: local backend")
    generate.run(config, quiet)
    console.print(table(collect(config)))
    console.print(f"config: {config_path}")
