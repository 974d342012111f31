import sys

import pytest

from eyas.config import ConfigError, RunConfig, dump_config, load_config, parse_config, resolve_api_key


def write(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_unknown_key_names_its_path(tmp_path):
    path = write(tmp_path, "run_dir: out\ngenerate:\n  concurency: 10\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "generate.concurency: unknown key" in str(e.value)
    assert str(path) in str(e.value)


def test_unknown_key_inside_a_dataset_names_the_index(tmp_path):
    path = write(tmp_path, "run_dir: out\ndatasets:\n  - name: a\n    source: a.jsonl\n    weigth: 2\n")
    with pytest.raises(ConfigError, match=r"datasets\[0\]\.weigth: unknown key"):
        load_config(path)


def test_a_datasets_old_max_tokens_is_refused_naming_its_new_name(tmp_path):
    path = write(tmp_path, "run_dir: out\ndatasets:\n  - name: a\n    source: a.jsonl\n    max_tokens: 1000\n")
    with pytest.raises(ConfigError, match=r"datasets\[0\]: .*max_tokens was renamed merge_token_budget"):
        load_config(path)


def test_wrong_type_names_path_and_expected_type(tmp_path):
    path = write(tmp_path, "run_dir: out\ngenerate:\n  max_tokens: lots\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert "generate.max_tokens: Input should be a valid integer (got str 'lots')" in str(e.value)


def test_strings_are_not_coerced_to_numbers():
    with pytest.raises(ConfigError, match=r"generate\.temperature"):
        parse_config({"run_dir": "x", "generate": {"temperature": "0.7"}})


def test_llamacpp_p_min_values_are_probabilities_read_once_each_in_order():
    assert parse_config({"run_dir": "x", "eval": {"llamacpp_p_min": [0.5, 0, 0.5]}}).eval.llamacpp_p_min == [0, 0.5]
    with pytest.raises(ConfigError, match=r"eval\.llamacpp_p_min: .*\[0, 1\)"):
        parse_config({"run_dir": "x", "eval": {"llamacpp_p_min": [1.0]}})


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ({"tune": {"p_min": [0.95, 1.0]}}, r"tune\.p_min: .*\[0, 1\)"),
        ({"tune": {"threads": [2, 0]}}, r"tune\.threads: .*from 1"),
        ({"tune": {"in_flight": [1]}}, r"tune\.in_flight: .*2 or more"),
        ({"tune": {"min_rounds": 4, "max_rounds": 3}}, r"tune: .*max_rounds \(3\) is below min_rounds \(4\)"),
        ({"scaling": {"fractions": [0.5, 1.0]}}, r"scaling\.fractions: .*\(0, 1\)"),
        ({"scaling": {"target_tau": [0.9]}}, r"scaling\.target_tau: .*above 1"),
    ],
)
def test_tune_and_scaling_settings_are_refused_by_key(section, match):
    with pytest.raises(ConfigError, match=match):
        parse_config({"run_dir": "x", **section})


def test_missing_required_key():
    with pytest.raises(ConfigError, match=r"run_dir: required key is missing"):
        parse_config({})


def test_bad_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, "run_dir: out\ngenerate:\n  max_tokens: [1,\n")
    with pytest.raises(ConfigError, match=rf"{path}:\d+: not valid YAML"):
        load_config(path)


def test_http_backend_needs_an_endpoint():
    with pytest.raises(ConfigError, match="needs generate.http.base_url"):
        parse_config({"run_dir": "x", "generate": {"backend": "openai", "http": {"model": "m"}}})


def test_http_keys_moved_under_generate_http_name_their_new_place():
    with pytest.raises(ConfigError, match=r"generate: .*base_url moved to generate.http.base_url"):
        parse_config({"run_dir": "x", "generate": {"backend": "openai", "base_url": "http://h/v1"}})
    with pytest.raises(ConfigError, match=r"read_timeout_s moved to generate.http.timeouts.read_s"):
        parse_config({"run_dir": "x", "generate": {"read_timeout_s": 5.0}})
    with pytest.raises(ConfigError, match=r"max_attempts moved to generate.http.retry.max_attempts"):
        parse_config({"run_dir": "x", "generate": {"max_attempts": 3}})


def test_duplicate_dataset_names_are_rejected():
    data = {"run_dir": "x", "datasets": [{"name": "a", "source": "a.jsonl"}, {"name": "a", "source": "b.jsonl"}]}
    with pytest.raises(ConfigError, match="repeated: a"):
        parse_config(data)


def test_relative_paths_resolve_against_the_config_file(tmp_path):
    path = write(
        tmp_path,
        "run_dir: out\ndatasets:\n  - name: a\n    source: data/a.jsonl\n  - name: b\n    source: org/hub-set\n",
    )
    config = load_config(path)
    assert config.run_dir == str(tmp_path / "out")
    assert config.datasets[0].source == str(tmp_path / "data" / "a.jsonl")
    assert config.datasets[1].source == "org/hub-set"


def test_dump_fills_in_every_default():
    text = dump_config(RunConfig(run_dir="x"))
    for key in ("generate:", "concurrency: 64", "tokenize:", "merge:", "extract:", "train:", "ttt_steps: 7", "eval:"):
        assert key in text


def test_api_key_from_env_and_file(tmp_path, monkeypatch):
    monkeypatch.setenv("EYAS_TEST_KEY", "sk-secret-env")
    assert resolve_api_key("EYAS_TEST_KEY", None) == "sk-secret-env"
    key_file = tmp_path / "key"
    key_file.write_text("sk-secret-file\n")
    assert resolve_api_key(None, str(key_file)) == "sk-secret-file"


def test_missing_api_key_error_never_shows_a_value(tmp_path, monkeypatch):
    monkeypatch.delenv("EYAS_ABSENT_KEY", raising=False)
    with pytest.raises(ConfigError, match="generate.http.api_key_env: environment variable EYAS_ABSENT_KEY is not set"):
        resolve_api_key("EYAS_ABSENT_KEY", None)
    with pytest.raises(ConfigError, match="generate.http.api_key_file: cannot read"):
        resolve_api_key(None, str(tmp_path / "nope"))


def test_a_relative_vllm_python_is_taken_against_the_config_file_and_its_link_kept(tmp_path):
    python = tmp_path / "envs" / "vllm" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    (tmp_path / "runs").mkdir()
    path = write(
        tmp_path / "runs", "run_dir: out\ntarget:\n  vllm_python: ../envs/vllm/bin/python\n  engine_timeout_s: 60\n"
    )
    config = load_config(path)
    # Absolute, `..` folded, but not resolved: a virtual environment's python is a symlink.
    assert config.target.vllm_python == str(python)
    assert config.target.engine_timeout_s == 60.0


def test_vllm_timeout_must_be_positive():
    with pytest.raises(ConfigError, match=r"target.engine_timeout_s: Input should be greater than 0"):
        parse_config({"run_dir": "x", "target": {"engine_timeout_s": 0}})
