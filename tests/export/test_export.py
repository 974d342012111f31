"""Export layouts: golden key lists, config keys, reload to identical outputs, the CLI."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import eyas.export
from eyas.config import ConfigError
from eyas.drafter.families import load_drafter, save_drafter
from eyas.space import EXIT_CODE as DISK_FULL
from eyas.stage import StageError
from tests.disks import fill, small_disk
from tests.kills import kill_at_each
from tests.stages import mark_finished
from tests.train.conftest import load_tiny, subprocess_env, write_config
from tests.train.helpers import small_drafter

MIDLAYER = [
    "input_layernorm.weight",
    "hidden_norm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
]
SGLANG_KEYS = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} | {f"midlayer.{k}" for k in MIDLAYER}
SPECULATORS_KEYS = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} | {f"layers.0.{k}" for k in MIDLAYER}
LLAMA_CONFIG_KEYS = {
    "model_type",
    "num_hidden_layers",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "max_position_embeddings",
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "torch_dtype",
}
SGLANG_CONFIG_KEYS = LLAMA_CONFIG_KEYS | {
    "architectures",
    "draft_vocab_size",
    "target_hidden_size",
    "eagle_config",
    "eagle_aux_hidden_state_layer_ids",
}
SPECULATORS_CONFIG_KEYS = {
    "architectures",
    "speculators_model_type",
    "transformer_layer_config",
    "draft_vocab_size",
    "norm_before_residual",
    "target_hidden_size",
    "eagle_aux_hidden_state_layer_ids",
    "speculators_config",
    "torch_dtype",
}


@pytest.fixture
def trained_run(tmp_path, model):
    run_dir = tmp_path / "run"
    drafter = small_drafter(model)
    save_drafter(drafter, run_dir / "train" / "final")
    return run_dir, drafter


def outputs(drafter):
    torch.manual_seed(0)
    aux, ids = torch.randn(1, 7, 3 * 576), torch.randint(0, 49152, (1, 7))
    with torch.no_grad():
        return [x.clone() for x in drafter.unroll(aux, ids, 3)]


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_sglang_and_vllm_layout(trained_run, model, fmt):
    run_dir, drafter = trained_run
    out = eyas.export.export_one(load_tiny(run_dir), fmt)
    assert out == run_dir / "export" / fmt
    assert set(load_file(str(out / "model.safetensors"))) == SGLANG_KEYS
    config = json.loads((out / "config.json").read_text())
    assert set(config) == SGLANG_CONFIG_KEYS
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1 and config["tie_word_embeddings"] is False
    assert config["vocab_size"] == 49152 and config["draft_vocab_size"] == 512 and config["target_hidden_size"] == 576
    # The drafter reads the outputs of 0-based layers 1, 14, 26 of the 30-layer target. SGLang reads
    # eagle_config's ids as output layers; vLLM and llama.cpp read the top-level ids as the state
    # entering layer k (HF hidden_states[k]), so they must be one higher.
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    assert config["torch_dtype"] == "float32"  # the embedded target is float32
    assert config["rope_theta"] == 100000.0 and config["rope_scaling"] is None
    readme = (out / "README.md").read_text()
    assert "--speculative-algorithm EAGLE3" in readme and f"--speculative-draft-model-path {out.resolve()}" in readme
    # Every serve command names the target's precision: SGLang's `auto` would serve float32 in float16.
    assert readme.count("--dtype float32") == 2
    assert '"method": "eagle3"' in readme
    for a, b in zip(outputs(drafter), outputs(load_drafter(out, model))):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("switches", "unread"),
    [({"norm_before_fc": True}, "norm_before_fc"), ({"norm_before_residual": True}, "norm_before_residual")],
)
def test_an_sglang_readme_says_sglang_would_not_serve_switches_it_does_not_read(tmp_path, model, switches, unread):
    """SGLang's EAGLE-3 model has no input norm and adds the raw state as the residual: it would
    load such a drafter silently and draft from other states, so no SGLang command is printed."""
    run_dir = tmp_path / "run"
    save_drafter(small_drafter(model, eagle3=switches), run_dir / "train" / "final")
    readme = (eyas.export.export_one(load_tiny(run_dir), "sglang") / "README.md").read_text()
    assert "sglang.launch_server" not in readme and f"SGLang's EAGLE-3 model does not read {unread}" in readme
    assert '"method": "eagle3"' in readme, "the vLLM command is still there"


def test_speculators_layout(trained_run, model, tmp_path):
    run_dir, drafter = trained_run
    out = eyas.export.export_one(load_tiny(run_dir), "speculators", out=tmp_path / "spec")
    assert set(load_file(str(out / "model.safetensors"))) == SPECULATORS_KEYS
    config = json.loads((out / "config.json").read_text())
    assert set(config) == SPECULATORS_CONFIG_KEYS
    assert set(config["transformer_layer_config"]) == LLAMA_CONFIG_KEYS | {"architectures"}
    assert config["architectures"] == ["Eagle3Speculator"] and config["speculators_model_type"] == "eagle3"
    assert config["norm_before_residual"] is False
    spec = config["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"] == [{"proposal_type": "greedy", "speculative_tokens": 3}]
    assert spec["verifier"]["architectures"] == ["LlamaForCausalLM"] and spec["verifier"]["name_or_path"]
    # speculators configs are read by vLLM: the state entering layer k.
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    for a, b in zip(outputs(drafter), outputs(load_drafter(out, model))):
        assert torch.equal(a, b)


def test_exported_weights_follow_the_umask(trained_run):
    """safetensors alone writes 0600: a server running as another user could not read the drafter."""
    run_dir, _ = trained_run
    previous = os.umask(0o027)
    try:
        out = eyas.export.export_one(load_tiny(run_dir), "sglang")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((out / "model.safetensors").stat().st_mode) == 0o640


def test_export_before_training_names_the_missing_directory(tmp_path):
    with pytest.raises(StageError, match="train/final"):
        eyas.export.run(load_tiny(tmp_path / "run"))


def exportable(run_dir: Path) -> Path:
    """The run's config file, with the drafter made by hand declared finished, and the corpus it
    would come from, so that `eyas export` takes it."""
    config = write_config(run_dir)
    for path in (run_dir / "tokenize" / "report.json", run_dir / "merge" / "stats.json"):
        path.parent.mkdir()
        path.write_text("{}")
    mark_finished(load_tiny(run_dir), "generate", "tokenize", "merge", "train")
    return config


def test_cli_export_and_bad_format(trained_run):
    run_dir, _ = trained_run
    config = exportable(run_dir)
    done = subprocess.run(
        [sys.executable, "-m", "eyas", "export", str(config), "--format", "vllm"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert (run_dir / "export" / "vllm" / "model.safetensors").is_file()
    bad = subprocess.run(
        [sys.executable, "-m", "eyas", "export", str(config), "--format", "onnx"],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )
    assert bad.returncode == 2 and "--format" in bad.stdout + bad.stderr


def test_speculators_readme_serves_the_directory(trained_run, tmp_path):
    run_dir, _ = trained_run
    out = eyas.export.export_one(load_tiny(run_dir), "speculators")
    assert (
        f"vllm.entrypoints.openai.api_server --model {out.resolve()} --dtype float32" in (out / "README.md").read_text()
    )


def test_export_is_in_the_targets_dtype(trained_run, model, tmp_path):
    """SGLang runs a float32 drafter in float16 beside a bfloat16 target: the export follows the target."""
    from eyas.export import target_dtype

    class Config:
        dtype = "bfloat16"

    assert target_dtype(Config()) == torch.bfloat16
    _, drafter = trained_run
    out = tmp_path / "bf16"
    save_drafter(drafter, out, torch.bfloat16)
    weights = load_file(str(out / "model.safetensors"))
    assert weights["fc.weight"].dtype == torch.bfloat16 and weights["d2t"].dtype == torch.int64
    assert weights["t2d"].dtype == torch.bool
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    reloaded = load_drafter(out, model)
    assert torch.equal(reloaded.fc.weight, drafter.fc.weight.to(torch.bfloat16).float())


def _rewrite_config(directory, change) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


def _without_top_level_ids(config):
    del config["eagle_aux_hidden_state_layer_ids"]


def _without_eagle_config(config):
    del config["eagle_config"]


def _old_eyas_numbering(config):
    config["eagle_aux_hidden_state_layer_ids"] = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]


@pytest.mark.parametrize(
    "change",
    [_without_top_level_ids, _without_eagle_config, _old_eyas_numbering],
    ids=["specforge-sglang", "vllm-only", "eyas-before-the-fix"],
)
def test_foreign_numberings_load_with_the_layers_they_mean(trained_run, model, tmp_path, change):
    _, drafter = trained_run
    out = tmp_path / "foreign"
    save_drafter(drafter, out)
    _rewrite_config(out, change)
    reloaded = load_drafter(out, model)
    assert reloaded.spec.aux_layers == (1, 14, 26)
    for a, b in zip(outputs(drafter), outputs(reloaded)):
        assert torch.equal(a, b)


def test_original_eagle3_release_layout_loads(trained_run, model, tmp_path):
    """The EAGLE-3 releases: pytorch_model.bin with the embedding inside, no layer ids (the default layers)."""
    _, drafter = trained_run
    out = tmp_path / "release"
    save_drafter(drafter, out)
    weights = load_file(str(out / "model.safetensors"))
    weights["embed_tokens.weight"] = model.get_input_embeddings().weight.detach().clone()
    torch.save(weights, out / "pytorch_model.bin")
    (out / "model.safetensors").unlink()
    _rewrite_config(out, lambda c: [_without_top_level_ids(c), _without_eagle_config(c)])
    reloaded = load_drafter(out, model)
    assert reloaded.spec.aux_layers == (1, 14, 26)
    for a, b in zip(outputs(drafter), outputs(reloaded)):
        assert torch.equal(a, b)


def test_export_refuses_layers_a_server_cannot_capture(trained_run):
    run_dir, _ = trained_run
    _rewrite_config(
        run_dir / "train" / "final", lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 14, 29])
    )
    with pytest.raises(ConfigError, match=r"0\.\.28 for a 30-layer target"):
        eyas.export.export_one(load_tiny(run_dir), "vllm")


def test_a_gguf_readme_says_when_eyas_could_not_tell_that_llamacpp_serves_it(tmp_path):
    """A "cannot tell" verdict left only a log line, and the README printed the command as if checked."""
    from eyas.export.gguf import gguf_readme

    args = (
        tmp_path / "llama-server",
        tmp_path / "t.gguf",
        None,
        tmp_path / "d.gguf",
        ("f32", "f32"),
        3,
        "draft-eagle3",
        "EAGLE-3",
    )
    assert "Not checked" not in gguf_readme(*args)
    unsure = gguf_readme(*args, "llama.cpp's graph for the plain architecture could not be found")
    assert "**Not checked:**" in unsure and "graph for the plain architecture could not be found" in unsure
    assert "eyas export CONFIG --format vllm" in unsure


@pytest.mark.parametrize(
    "args, said",
    [
        (["--format", "gguf", "--gguf-type", "q4_0"], "--gguf-type: invalid config"),
        (["--gguf-type", "f16"], "--gguf-type: the GGUF type is for --format gguf"),
    ],
)
def test_a_gguf_type_the_converter_cannot_write_is_refused_naming_the_option(args, said, tmp_path):
    from typer.testing import CliRunner

    from eyas.cli import app
    from eyas.config import ConfigError
    from tests.train.conftest import write_config

    (tmp_path / "run").mkdir()
    result = CliRunner().invoke(app, ["export", str(write_config(tmp_path / "run")), *args, "-q"])
    assert isinstance(result.exception, ConfigError) and said in str(result.exception)
    assert "q8_0" in str(result.exception) or "--format gguf" in said
    assert not (tmp_path / "run" / "export").exists(), "nothing is written"


@pytest.mark.slow
def test_an_export_that_will_not_fit_stops_before_writing_and_keeps_the_old_layout(trained_run, tmp_path):
    with small_disk(tmp_path / "disk", "64M") as disk:  # the drafter, a layout, and room for one more
        run_dir = shutil.copytree(trained_run[0], disk / "run")
        command = [sys.executable, "-m", "eyas", "export", str(exportable(run_dir)), "--format", "vllm", "-q"]
        assert subprocess.run(command, env=subprocess_env(), timeout=300).returncode == 0
        layout = run_dir / "export" / "vllm"
        old = {f.name: f.read_bytes() for f in layout.iterdir()}
        ballast = fill(disk)
        done = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), timeout=300)
        said = " ".join((done.stdout + done.stderr).split())
        assert done.returncode == DISK_FULL, said
        assert "free on its disk, and this would write about" in said and "export: vllm" in said, said
        assert {f.name: f.read_bytes() for f in layout.iterdir()} == old
        assert not layout.with_name("vllm.tmp").exists()
        ballast.unlink()
        assert subprocess.run(command, env=subprocess_env(), timeout=300).returncode == 0


@pytest.mark.slow
def test_an_export_killed_at_any_point_leaves_the_old_layout_or_the_new_never_a_mix(trained_run, model, tmp_path):
    run_dir, _ = trained_run
    command = [sys.executable, "-m", "eyas", "export", str(exportable(run_dir)), "--format", "vllm", "-q"]
    assert subprocess.run(command, env=subprocess_env(), timeout=300).returncode == 0
    layout = run_dir / "export" / "vllm"

    def files(root: Path = run_dir) -> dict:
        """The layout under ``root``, file by file (its README names the directory: written as <run>)."""
        where = root / "export" / "vllm"
        return {f.name: f.read_bytes().replace(bytes(root), b"<run>") for f in sorted(where.iterdir())}

    old = files()
    save_drafter(small_drafter(model, seed=1), run_dir / "train" / "final")  # another drafter to export
    uninterrupted = shutil.copytree(run_dir, tmp_path / "uninterrupted")
    config = write_config(uninterrupted)
    done = subprocess.run([*command[:4], str(config), *command[5:]], env=subprocess_env(), timeout=300)
    assert done.returncode == 0
    new = files(uninterrupted)
    aside = layout.with_name("vllm.tmp")
    kill_points = [
        lambda: aside.is_dir(),
        lambda: (aside / "model.safetensors").exists(),
        lambda: (aside / "README.md").exists(),
    ]
    seen = kill_at_each(command, kill_points, files, old, env=subprocess_env())
    assert seen[0] == "old", seen
    assert files() in (old, new)
    assert subprocess.run(command, env=subprocess_env(), timeout=300).returncode == 0
    assert files() == new != old and not aside.exists()
