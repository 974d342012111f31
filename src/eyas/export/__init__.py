"""Stage 6b — export: the trained drafter as a directory SGLang, vLLM or speculators loads.

Consumes ``<run_dir>/train/final/`` (written by ``eyas train``). Produces
``<run_dir>/export/<format>/`` (or ``--out``): ``config.json``, ``model.safetensors`` (no
``embed_tokens``: servers take the target's) and a ``README.md`` with the serve commands.

- ``sglang`` and ``vllm``: ``LlamaForCausalLMEagle3`` with ``midlayer.*`` weights; the aux layer
  ids sit under ``eagle_config`` as output-layer ids (SGLang) and at the top level as
  capture-before-layer ids, one higher (vLLM, llama.cpp); see :mod:`eyas.drafter.families.eagle3`.
- ``speculators``: ``Eagle3Speculator`` with ``layers.0.*`` weights, the Llama layer config under
  ``transformer_layer_config`` and a greedy proposal of ``eval.num_draft_tokens`` tokens.

Weights and ``torch_dtype`` are in the target's own dtype: SGLang, with its dtype ``auto``,
runs a float32 drafter in float16 beside a bfloat16 target, so a float32 export is written
only for a float32 target. Training checkpoints stay float32.

Guarantees: the directory appears complete or not at all (written aside, then swapped in), and
:func:`eyas.drafter.families.load_drafter` reloads it to the same outputs. The stage
(``eyas export CONFIG``) writes the layouts the run serves (:func:`formats_for`) and then its
marker, ``export/stage.json``; an export of another layout or to ``--out`` is an extra copy
and leaves the marker alone.
"""

from __future__ import annotations

from pathlib import Path

from eyas.config import ConfigError, RunConfig
from eyas.drafter.layout import target_dtype
from eyas.files import built_aside
from eyas.paths import RunPaths
from eyas.stage import StageContract, StageError, begin, target_identity

FORMATS = ("sglang", "vllm", "speculators", "gguf")


def formats_for(config: RunConfig) -> list[str]:
    """What ``eyas run`` exports: the SGLang layout always; the one eval serves in an engine too."""
    return ["sglang"] + {"vllm": ["vllm"], "llamacpp": ["gguf"]}.get(config.eval.engine, [])


def main_file(paths: RunPaths, format: str) -> Path:
    """The file whose presence means a layout was exported."""
    return paths.export_gguf if format == "gguf" else paths.export(format) / "config.json"


CONTRACT = StageContract(
    "export",
    lambda c: ["train"],
    # The target names the served dtype and the verifier; speculators' config holds the draft length.
    lambda c: {
        **target_identity(c.target),
        "export formats": formats_for(c),
        "eval.num_draft_tokens": c.eval.num_draft_tokens,
        **({"export.gguf_type": c.export.gguf_type} if "gguf" in formats_for(c) and c.export.gguf_type else {}),
    },
    lambda c, p: [main_file(p, f) for f in formats_for(c)],
)


def run(config: RunConfig, quiet: bool = False) -> list[Path]:
    """The stage: every layout the run serves, then the marker; returns their directories."""
    paths = RunPaths.of(config)
    started = begin(config, CONTRACT, paths)
    _require_room(paths, formats_for(config))
    # Until every layout is rewritten, no marker vouches for the directory.
    paths.marker("export").unlink(missing_ok=True)
    written = [export_one(config, f) for f in formats_for(config)]
    started.finish(paths.marker("export"))
    return written


def _require_room(paths: RunPaths, formats: list[str]) -> None:
    """Each layout holds the drafter's weights once (at most as large as training's float32),
    written beside the old one before it is replaced."""
    from eyas.drafter.layout import WEIGHTS_FILE
    from eyas.space import Need, require_room

    weights = paths.train_final / WEIGHTS_FILE
    if weights.is_file():
        need = Need(f"export: {', '.join(formats)}", weights.stat().st_size * len(formats))
        require_room(paths.export_dir, [need], [])


def export_one(config: RunConfig, format: str = "sglang", out: str | Path | None = None) -> Path:
    """Write one layout (to ``run_dir/export/FORMAT`` or ``out``); returns its directory."""
    from eyas.drafter import layout
    from eyas.drafter.families import family_of, read_drafter
    from eyas.target import load_model_config, text_config
    from eyas.target.capture import check_aux_layers

    if format not in FORMATS:
        raise ConfigError(f"--format: {format!r} is not one of {', '.join(FORMATS)}")
    paths = RunPaths.of(config)
    source = paths.train_final
    if not (source / layout.CONFIG_FILE).is_file():
        raise StageError(f"{source}: no trained drafter yet; run `eyas train CONFIG` first")
    model_config = load_model_config(config.target)
    num_layers = text_config(model_config).num_hidden_layers
    spec, weights = read_drafter(source, num_layers)
    family = family_of(spec)
    try:
        where = f"{source / layout.CONFIG_FILE}: aux layers"
        check_aux_layers(list(spec.aux_layers), num_layers, where, family.aux_layer_count)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    family.require_format(format)
    out = Path(out) if out is not None else paths.export(format)
    _require_room(paths, [format])
    with built_aside(out) as tmp:
        _write_layout(config, format, family, spec, weights, model_config, tmp, out)
    return out


def _write_layout(config: RunConfig, format: str, family, spec, weights, model_config, tmp: Path, out: Path) -> None:
    """The layout's files and its README (how to serve it from ``out``) in ``tmp``."""
    from eyas.drafter import layout
    from eyas.target import resolve_target

    dtype = target_dtype(model_config)
    verifier = resolve_target(config.target).name_or_path
    steps = spec.draft_length(config.eval.num_draft_tokens)
    if format == "gguf":
        from eyas.export.gguf import write_gguf
        from eyas.target.llamacpp_support import require_served

        # Refused here rather than a README whose command aborts the server on its first request.
        support = require_served(config.target, family, list(family.options(spec)))
        unsure = support.reason if support.serves is None else None
        gguf_type = config.export.gguf_type
        readme = write_gguf(config.target, weights, spec, dtype, gguf_type, tmp, out.resolve(), steps, unsure)
    else:
        architectures = list(getattr(model_config, "architectures", None) or [])
        family.export(format, weights, spec, tmp, dtype, (verifier, architectures), steps)
        readme = family.readme(spec, format, out.resolve(), verifier, steps, layout.dtype_name(dtype))
    (tmp / "README.md").write_text(readme)
