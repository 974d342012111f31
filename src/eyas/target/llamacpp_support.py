"""Whether the llama.cpp eyas runs can serve a drafter beside a target, read from that tree's source.

llama.cpp feeds an EAGLE-3 or DFlash drafter the target's hidden states by asking the target's
model graph for the input of each layer the drafter reads (``res->t_layer_inp[il]``); a graph
that never sets them makes ``llama-server`` abort on its first request
(``GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null")``). Which graphs set
them changes from release to release, so eyas reads it from the tree it builds and runs rather
than keeping a list: the answer is as current as the engine.

The chain, each link read from the tree's own files:

1. the target's Hugging Face architecture (``architectures[0]``, the text config's when it names
   one, as the converter decides) → the converter class registered for it
   (``@ModelBase.register(...)`` in ``conversion/*.py`` or ``convert_hf_to_gguf.py``) → its
   ``model_arch`` (inherited from a base class when not its own);
2. that ``MODEL_ARCH`` → the GGUF architecture name (``gguf-py/gguf/constants.py``) → the
   ``LLM_ARCH_*`` enum (``src/llama-arch.cpp``) → the model class ``llama_model_mapping``
   creates for it (``src/llama-model.cpp``);
3. that class's ``build_arch_graph`` (its own or a base class's, ``src/models/models.h``) → the
   graph file defining it (``src/models/*.cpp``) → whether that file sets ``t_layer_inp[il]``.

A drafter family is served only where the tree also knows its drafter's GGUF architecture
(``eagle3``, ``dflash``). Where a link cannot be followed (a tree laid out otherwise), the answer
is "cannot tell", never a guess.
"""

from __future__ import annotations

import ast
import functools
import logging
import re
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

LAYER_INPUT_SET = re.compile(r"t_layer_inp\[\s*il\s*\]\s*=")


@dataclass(frozen=True)
class Support:
    """Whether ``llama-server`` serves a family's drafter beside a target, and why, in words."""

    serves: bool | None
    """None: the tree's source could not be followed far enough to tell."""
    reason: str
    architecture: str | None = None
    """The target's GGUF architecture, as llama.cpp's converter writes it."""
    graph: str | None = None
    """The model graph file llama.cpp builds the target with, relative to the tree."""


def serving_support(tree: Path, hf_config: dict, drafter_arch: str, title: str | None = None) -> Support:
    """Whether the llama.cpp source tree ``tree`` serves a drafter of llama.cpp architecture
    ``drafter_arch`` (``eagle3``, ``dflash``; ``title``: its family in prose) beside a target whose
    ``config.json`` is ``hf_config``."""
    hf_arch = _hf_architecture(hf_config)
    if hf_arch is None:
        return Support(None, "the target's config.json names no architecture")
    model_arch = _converter_archs(tree).get(hf_arch)
    if model_arch is None:
        return Support(False, f"llama.cpp's converter has no class for {hf_arch}, so the target has no GGUF file")
    arch = _gguf_arch_names(tree).get(model_arch)
    enums = _llm_arch_enums(tree)
    if arch is None or arch not in enums:
        return Support(None, f"MODEL_ARCH.{model_arch} could not be traced to a llama.cpp architecture")
    if drafter_arch not in enums:
        return Support(False, f"this llama.cpp has no {drafter_arch} drafter architecture", arch)
    model_class = _model_classes(tree).get(enums[arch])
    graph = _graph_file(tree, model_class) if model_class else None
    if graph is None:
        return Support(None, f"llama.cpp's graph for the {arch} architecture could not be found", arch)
    where = str(graph.relative_to(tree))
    if LAYER_INPUT_SET.search(graph.read_text(errors="replace")):
        return Support(True, f"llama.cpp's {arch} graph ({where}) hands the drafter each layer's input", arch, where)
    return Support(
        False,
        f"llama.cpp's {arch} graph ({where}) does not capture the layer inputs {title or drafter_arch} drafters read "
        '(it never sets t_layer_inp), so llama-server aborts on the first request ("layer input tensor is null")',
        arch,
        where,
    )


def unread_options(tree: Path, options: list[str]) -> list[str]:
    """The drafter ``config.json`` keys among ``options`` that llama.cpp's converter never reads
    (no ``"key"`` in ``conversion/*.py`` or ``convert_hf_to_gguf.py``): a GGUF made from such a
    drafter would run the graph without them, on states the drafter was not trained on."""
    sources = [tree / "convert_hf_to_gguf.py", *sorted((tree / "conversion").glob("*.py"))]
    text = "".join(p.read_text(errors="replace") for p in sources if p.is_file())
    return [key for key in options if f'"{key}"' not in text]


def require_served(target, family, options: list[str] = ()) -> Support:
    """The verdict for a run's target (a ``TargetConfig``) and a drafter ``family`` (an
    :class:`eyas.drafter.family.Family`) in the llama.cpp eyas runs; raises
    ConfigError saying why when that llama.cpp cannot serve the drafter, or does not read one of
    its ``options`` (EAGLE-3.1's ``norm_output``), and logs a warning when its source cannot tell."""
    from eyas.config import ConfigError
    from eyas.target import load_model_config
    from eyas.target.llamacpp import find_llamacpp

    llamacpp = find_llamacpp(target.llamacpp)
    unread = unread_options(llamacpp.tree, list(options))
    if unread:
        raise ConfigError(
            f"llama.cpp ({llamacpp.tree}) does not read {', '.join(unread)} from a drafter's config, and this "
            f"drafter was trained with it (train.{family.name}.{unread[0]}): its graph would draft from other states. "
            "Serve it in vLLM (`eyas export CONFIG --format vllm`), or train without it"
        )
    support = serving_support(llamacpp.tree, load_model_config(target).to_dict(), family.llamacpp_arch, family.title)
    if support.serves is False:
        raise ConfigError(
            f"llama.cpp ({llamacpp.tree}) cannot serve this target's {family.title} drafter: {support.reason}. "
            "Serve it in vLLM or SGLang (`eyas export CONFIG --format vllm`), or point target.llamacpp at a "
            "llama.cpp whose graph for this architecture captures layer inputs"
        )
    if support.serves is None:
        log.warning(
            "llama.cpp (%s): cannot tell whether it serves this target's drafter: %s", llamacpp.tree, support.reason
        )
    return support


def _hf_architecture(hf_config: dict) -> str | None:
    """The architecture llama.cpp's converter converts the target as: the text config's, else the top level's."""
    for config in (hf_config.get("text_config") or {}, hf_config):
        if config.get("architectures"):
            return config["architectures"][0]
    return None


def _is_model_arch(node: ast.expr) -> str | None:
    """``X`` for the expression ``gguf.MODEL_ARCH.X`` (or ``MODEL_ARCH.X``)."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, (ast.Attribute, ast.Name)):
        owner = node.value.attr if isinstance(node.value, ast.Attribute) else node.value.id
        if owner == "MODEL_ARCH":
            return node.attr
    return None


@functools.cache
def _converter_archs(tree: Path) -> dict[str, str]:
    """Hugging Face architecture -> the ``MODEL_ARCH`` member its converter class declares."""
    classes: dict[str, ast.ClassDef] = {}
    for path in [tree / "convert_hf_to_gguf.py", *sorted((tree / "conversion").glob("*.py"))]:
        if path.is_file():
            for node in ast.walk(ast.parse(path.read_text(errors="replace"))):
                if isinstance(node, ast.ClassDef):
                    classes.setdefault(node.name, node)

    def declared(name: str, seen: frozenset = frozenset()) -> str | None:
        node = classes.get(name)
        if node is None or name in seen:
            return None
        for statement in node.body:
            if isinstance(statement, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "model_arch" for t in statement.targets
            ):
                return _is_model_arch(statement.value)
        bases = (b.id for b in node.bases if isinstance(b, ast.Name))
        return next(filter(None, (declared(b, seen | {name}) for b in bases)), None)

    archs: dict[str, str] = {}
    for name, node in classes.items():
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", None) == "register":
                arch = declared(name)
                for arg in decorator.args:
                    if arch and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        archs.setdefault(arg.value, arch)
    return archs


@functools.cache
def _gguf_arch_names(tree: Path) -> dict[str, str]:
    """``MODEL_ARCH`` member -> GGUF architecture name (``MODEL_ARCH_NAMES`` in gguf-py)."""
    constants = tree / "gguf-py" / "gguf" / "constants.py"
    if not constants.is_file():
        return {}
    for node in ast.walk(ast.parse(constants.read_text())):
        if isinstance(node, ast.AnnAssign | ast.Assign) and isinstance(node.value, ast.Dict):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "MODEL_ARCH_NAMES" for t in targets):
                return {
                    _is_model_arch(k): v.value
                    for k, v in zip(node.value.keys, node.value.values)
                    if k is not None and _is_model_arch(k) and isinstance(v, ast.Constant)
                }
    return {}


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


@functools.cache
def _llm_arch_enums(tree: Path) -> dict[str, str]:
    """GGUF architecture name -> ``LLM_ARCH_*`` (``LLM_ARCH_NAMES`` in ``src/llama-arch.cpp``)."""
    pairs = re.findall(r'\{\s*(LLM_ARCH_\w+)\s*,\s*"([^"]+)"\s*\}', _read(tree / "src" / "llama-arch.cpp"))
    return {name: enum for enum, name in pairs}


@functools.cache
def _model_classes(tree: Path) -> dict[str, str]:
    """``LLM_ARCH_*`` -> the ``llama_model_*`` class ``llama_model_mapping`` creates for it."""
    source = _read(tree / "src" / "llama-model.cpp")
    start = source.find("llama_model_mapping(")
    body = source[start : source.find("\n}\n", start)] if start >= 0 else ""
    classes, pending = {}, []
    for case, created in re.findall(r"case\s+(LLM_ARCH_\w+)\s*:|return\s+new\s+(llama_model_\w+)\s*\(", body):
        if case:
            pending.append(case)
        else:
            classes |= dict.fromkeys(pending, created)
            pending = []
    return classes


@functools.cache
def _graph_file(tree: Path, model_class: str) -> Path | None:
    """The ``src/models`` file defining ``model_class``'s ``build_arch_graph``, or its nearest base class's."""
    models = tree / "src" / "models"
    header = _read(models / "models.h")
    seen = set()
    while model_class and model_class not in seen:
        seen.add(model_class)
        definition = re.compile(rf"\b{model_class}::build_arch_graph\s*\(")
        for path in sorted(models.glob("*.cpp")):
            if definition.search(_read(path)):
                return path
        base = re.search(rf"struct\s+{model_class}\s*:\s*public\s+(llama_model_\w+)", header)
        model_class = base.group(1) if base else None
    return None
