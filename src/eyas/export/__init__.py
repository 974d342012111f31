"""Stage 6b — export: the trained drafter as a directory SGLang, vLLM or speculators loads.

Consumes ``<run_dir>/train/final/`` (written by ``eyas train``). Produces
``<run_dir>/export/<format>/`` (or ``--out``): ``config.json``, ``model.safetensors`` (no
``embed_tokens``: servers take the target's) and a ``README.md`` with the serve commands.

- ``sglang`` and ``vllm``: ``LlamaForCausalLMEagle3`` with ``midlayer.*`` weights; the aux layer
  ids sit both under ``eagle_config`` (SGLang) and at the top level (vLLM).
- ``speculators``: ``Eagle3Speculator`` with ``layers.0.*`` weights, the Llama layer config under
  ``transformer_layer_config`` and a greedy proposal of ``eval.num_draft_tokens`` tokens.

Guarantees: the directory appears complete or not at all (written aside, then renamed), and
:meth:`eyas.train.drafter.Eagle3Drafter.load` reloads it to the same outputs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from eyas.config import ConfigError, RunConfig

FORMATS = ("sglang", "vllm", "speculators")


def run(config: RunConfig, format: str = "sglang", out: str | Path | None = None, quiet: bool = False) -> Path:
    """Write the export; returns its directory."""
    from eyas.export.readme import serve_readme
    from eyas.paths import RunPaths
    from eyas.target import load_model_config, resolve_target
    from eyas.train import layout
    from eyas.train.loop import final_dir

    if format not in FORMATS:
        raise ConfigError(f"--format: {format!r} is not one of {', '.join(FORMATS)}")
    paths = RunPaths.of(config)
    source = final_dir(paths)
    if not (source / layout.CONFIG_FILE).is_file():
        raise ConfigError(f"{source}: no trained drafter yet; run `eyas train CONFIG` first")
    spec, weights = layout.read_drafter(source)
    out = Path(out) if out is not None else paths.export_dir / format
    verifier = resolve_target(config.target).name_or_path
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if format == "speculators":
        architectures = list(getattr(load_model_config(config.target), "architectures", None) or [])
        layout.save_speculators(weights, spec, tmp, verifier, architectures, config.eval.num_draft_tokens)
    else:
        layout.save_sglang(weights, spec, tmp)
    (tmp / "README.md").write_text(serve_readme(format, out.resolve(), verifier, config.eval.num_draft_tokens))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
