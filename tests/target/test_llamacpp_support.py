"""Whether llama.cpp serves a drafter beside a target, read from its source: on a tree written
here link by link, and on the pinned tree eyas builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from eyas.target.llamacpp import CHECKOUT_TREE
from eyas.target.llamacpp_support import serving_support

GRAPH_WITH_INPUTS = """
std::unique_ptr<llm_graph_context> llama_model_{cls}::build_arch_graph(const llm_graph_params & params) const {{
    return std::make_unique<graph>(*this, params);
}}
llama_model_{cls}::graph::graph(const llama_model & model, const llm_graph_params & params) : llm_graph_context(params) {{
    for (int il = 0; il < n_layer; ++il) {{
        {capture}
        inpL = cur;
    }}
}}
"""


def write_tree(root: Path, capture: dict[str, bool]) -> Path:
    """A llama.cpp tree holding just the files the verdict reads: a converter with a base class
    (``plain``), an architecture inheriting its ``model_arch`` (``Derived``) and ``mistral4``'s
    model class inheriting ``plain``'s graph; ``capture``: graph name -> whether it sets layer inputs."""
    (root / "conversion").mkdir(parents=True)
    (root / "conversion" / "plain.py").write_text(
        "import gguf\n"
        "class TextModel: pass\n"
        '@ModelBase.register("PlainForCausalLM", "OtherPlainModel")\n'
        "class PlainModel(TextModel):\n    model_arch = gguf.MODEL_ARCH.PLAIN\n"
        '@ModelBase.register("DerivedForCausalLM")\n'
        "class DerivedModel(PlainModel):\n    pass\n"
        '@ModelBase.register("MlaForCausalLM")\n'
        "class MlaModel(TextModel):\n    model_arch = gguf.MODEL_ARCH.MLA\n"
        '@ModelBase.register("Mistral4ForCausalLM")\n'
        "class Mistral4Model(TextModel):\n    model_arch = gguf.MODEL_ARCH.MISTRAL4\n"
    )
    (root / "gguf-py" / "gguf").mkdir(parents=True)
    (root / "gguf-py" / "gguf" / "constants.py").write_text(
        "MODEL_ARCH_NAMES: dict[MODEL_ARCH, str] = {\n"
        '    MODEL_ARCH.PLAIN: "plain",\n    MODEL_ARCH.MLA: "mla",\n    MODEL_ARCH.MISTRAL4: "mistral4",\n'
        '    MODEL_ARCH.EAGLE3: "eagle3",\n}\n'
    )
    (root / "src" / "models").mkdir(parents=True)
    (root / "src" / "llama-arch.cpp").write_text(
        "static const std::map<llm_arch, const char *> LLM_ARCH_NAMES = {\n"
        '    { LLM_ARCH_PLAIN, "plain" },\n    { LLM_ARCH_MLA,   "mla"   },\n'
        '    { LLM_ARCH_MISTRAL4, "mistral4" },\n    { LLM_ARCH_EAGLE3, "eagle3" },\n};\n'
    )
    (root / "src" / "llama-model.cpp").write_text(
        "static llama_model * llama_model_mapping(llm_arch arch, const llama_model_params & params) {\n"
        "    switch (arch) {\n"
        "        case LLM_ARCH_PLAIN:\n            return new llama_model_plain(params);\n"
        "        case LLM_ARCH_MLA:\n            return new llama_model_mla(params);\n"
        "        case LLM_ARCH_MISTRAL4:\n            return new llama_model_mistral4(params);\n"
        '        default:\n            throw std::runtime_error("unsupported");\n    }\n}\n'
    )
    (root / "src" / "models" / "models.h").write_text(
        "struct llama_model_plain : public llama_model_base {};\n"
        "struct llama_model_mla : public llama_model_base {};\n"
        "struct llama_model_mistral4 : public llama_model_plain {};\n"
    )
    for cls, sets in capture.items():
        line = "res->t_layer_inp[il] = inpL;" if sets else "ggml_tensor * inpSA = inpL;"
        (root / "src" / "models" / f"{cls}.cpp").write_text(GRAPH_WITH_INPUTS.format(cls=cls, capture=line))
    return root


@pytest.fixture
def tree(tmp_path):
    return write_tree(tmp_path / "llama.cpp", {"plain": True, "mla": False})


def test_a_graph_that_sets_layer_inputs_serves(tree):
    support = serving_support(tree, {"architectures": ["PlainForCausalLM"]}, "eagle3")
    assert (support.serves, support.architecture, support.graph) == (True, "plain", "src/models/plain.cpp")


def test_a_graph_that_never_sets_layer_inputs_is_refused_saying_why(tree):
    support = serving_support(tree, {"architectures": ["MlaForCausalLM"]}, "eagle3")
    assert support.serves is False and (support.architecture, support.graph) == ("mla", "src/models/mla.cpp")
    assert "src/models/mla.cpp" in support.reason and "t_layer_inp" in support.reason
    assert "layer input tensor is null" in support.reason


def test_inherited_converter_arch_and_graph_are_followed(tree):
    """``model_arch`` from the converter's base class; ``build_arch_graph`` from the model's base class."""
    assert serving_support(tree, {"architectures": ["DerivedForCausalLM"]}, "eagle3").architecture == "plain"
    inherited = serving_support(tree, {"architectures": ["Mistral4ForCausalLM"]}, "eagle3")
    assert (inherited.serves, inherited.graph) == (True, "src/models/plain.cpp")


def test_the_text_configs_architecture_is_the_one_converted(tree):
    config = {"architectures": ["SomeVisionModel"], "text_config": {"architectures": ["MlaForCausalLM"]}}
    assert serving_support(tree, config, "eagle3").architecture == "mla"


def test_a_family_the_tree_has_no_drafter_for_is_refused(tree):
    support = serving_support(tree, {"architectures": ["PlainForCausalLM"]}, "dflash")
    assert support.serves is False and "no dflash drafter architecture" in support.reason


def test_an_architecture_the_converter_lacks_is_refused(tree):
    support = serving_support(tree, {"architectures": ["UnknownForCausalLM"]}, "eagle3")
    assert support.serves is False and "converter has no class for UnknownForCausalLM" in support.reason


def test_a_tree_laid_out_otherwise_cannot_tell(tmp_path):
    """A graph eyas cannot find is "cannot tell", not a refusal: the tree may serve it."""
    tree = write_tree(tmp_path / "llama.cpp", {})
    support = serving_support(tree, {"architectures": ["PlainForCausalLM"]}, "eagle3")
    assert support.serves is None and "could not be found" in support.reason
    assert serving_support(tree, {}, "eagle3").serves is None


@pytest.mark.parametrize(
    ("hf_arch", "gguf_arch", "graph", "serves"),
    [
        ("LlamaForCausalLM", "llama", "llama.cpp", True),
        ("Qwen3ForCausalLM", "qwen3", "qwen3.cpp", True),
        ("Qwen3MoeForCausalLM", "qwen3moe", "qwen3moe.cpp", True),
        ("GptOssForCausalLM", "gpt-oss", "openai-moe.cpp", True),
        ("DeepseekV3ForCausalLM", "deepseek2", "deepseek2.cpp", False),
        ("Gemma3ForCausalLM", "gemma3", "gemma3.cpp", False),
        ("Qwen2ForCausalLM", "qwen2", "qwen2.cpp", False),
    ],
)
@pytest.mark.parametrize("family", ["eagle3", "dflash"])
def test_the_pinned_tree(hf_arch, gguf_arch, graph, serves, family):
    """The pinned release's verdicts, which the architecture runs (tests/export/test_architectures.py)
    confirm by serving."""
    support = serving_support(CHECKOUT_TREE, {"architectures": [hf_arch]}, family)
    assert (support.serves, support.architecture, support.graph) == (serves, gguf_arch, f"src/models/{graph}")
