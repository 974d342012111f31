"""``eyas export --format gguf``: the drafter as the GGUF file llama.cpp serves, and its target's.

The drafter is written in the vLLM layout — whose top-level ``eagle_aux_hidden_state_layer_ids``
are what llama.cpp reads, as the input of each layer (eyas's ``aux_layers + 1``) — and converted
by llama.cpp's own converter with ``--target-model-dir`` (tokenizer, vocabulary size and layer
count come from the target). Its precision is ``export.gguf_type`` (``--gguf-type``): f32, f16,
bf16 or q8_0; by default the one the target's checkpoint declares (f32 for a float32 target such
as the embedded one, bf16 or f16 otherwise). Any of them keeps greedy outputs the target's own:
the target verifies every drafted token. A smaller type makes a draft step cheaper, which is
what decides whether drafting pays beside a quantized target.

The target needs a GGUF of its own: the same precision, converted from its Hugging Face
directory into ``$EYAS_CACHE/gguf/`` (the equal-precision pair on which greedy outputs must not
change with the draft), and, for the embedded target, the Q4_1 file it ships as. Both
conversions are :mod:`eyas.target.llamacpp`'s, cached by content: ``eyas eval --engine llamacpp``
measures the same drafter file (``draft.gguf`` is a copy of it) and the same target file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from eyas.config import TargetConfig
from eyas.paths import DRAFT_GGUF


def write_gguf(
    target: TargetConfig,
    weights: dict,
    spec,
    dtype: torch.dtype,
    gguf_type: str | None,
    tmp: Path,
    out: Path,
    steps: int,
    unsure: str | None,
) -> str:
    """Write the drafter's GGUF, in ``gguf_type`` (None: the target's precision), into ``tmp`` (to
    be renamed to ``out``); returns the README. ``unsure``: why eyas could not tell from
    llama.cpp's source whether it serves this target's drafter
    (:func:`eyas.target.llamacpp_support.require_served`), which the README then says."""
    from eyas.drafter.families import family_of, save_weights
    from eyas.drafter.layout import dtype_name
    from eyas.target.llamacpp import GGUF_TYPES, draft_gguf, find_llamacpp, target_ggufs

    llamacpp = find_llamacpp(target.llamacpp)
    outtype = GGUF_TYPES[dtype_name(dtype)]
    ggufs = target_ggufs(target, llamacpp, outtype)
    hf = tmp / "hf"
    save_weights(weights, spec, hf, dtype)
    shutil.copyfile(draft_gguf(llamacpp, hf, ggufs, gguf_type), tmp / DRAFT_GGUF)
    shutil.rmtree(hf)
    family = family_of(spec)
    return gguf_readme(
        llamacpp.server,
        ggufs.same_precision,
        ggufs.shipped,
        out / DRAFT_GGUF,
        (gguf_type or outtype, outtype),
        steps,
        family.llamacpp_spec_type,
        family.title,
        unsure,
    )


def gguf_readme(
    server: Path,
    target: Path,
    shipped: Path | None,
    draft: Path,
    types: tuple[str, str],
    steps: int,
    spec_type: str,
    title: str,
    unsure: str | None = None,
) -> str:
    """``types``: the drafter's GGUF type and the target's; ``spec_type``: the ``--spec-type``
    that serves the drafter; ``title``: its family in prose; ``unsure``: why it is not known that
    this llama.cpp serves it (None: it is)."""
    serve = f"--spec-type {spec_type} --spec-draft-n-max {steps} -md {draft}"
    drafter_type, target_type = types
    sections = [
        f"# {title} drafter for llama.cpp\n\nTrained by eyas, converted by llama.cpp's own converter: drafter in "
        f"{drafter_type}, target in {target_type}. The target verifies every drafted token, so greedy outputs are "
        "the target's own with or without the draft.\n",
        f"## llama.cpp\n\n```bash\n{server} -m {target} \\\n  {serve}\n```\n",
    ]
    if unsure is not None:
        sections.insert(
            1,
            f"**Not checked:** eyas could not tell from this llama.cpp's source whether it serves this target's "
            f'{title} drafter ({unsure}). If `llama-server` aborts on the first request with "layer input tensor '
            'is null", its graph for this target does not hand the drafter the layer inputs: serve the drafter in '
            "vLLM or SGLang (`eyas export CONFIG --format vllm`).\n",
        )
    if shipped is not None:
        sections.append(
            "The target as it ships (Q4_1, faster, not bit-equal to the f32 outputs); `--no-repack` because "
            "weight repacking crashes `llama-server` on some CPUs:\n\n"
            f"```bash\n{server} -m {shipped} --no-repack \\\n  {serve}\n```\n"
        )
    return "\n".join(sections)
