import subprocess
import sys


def eyas(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "eyas", *args], capture_output=True, text=True, cwd=cwd)


def test_config_show_prints_resolved_config(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("run_dir: out\ngenerate:\n  max_tokens: 32\n")
    result = eyas("config", "show", str(path))
    assert result.returncode == 0, result.stderr
    assert "max_tokens: 32" in result.stdout
    assert f"run_dir: {tmp_path / 'out'}" in result.stdout
    assert "batch_size: 16" in result.stdout


def test_config_error_is_a_message_not_a_traceback(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("run_dir: out\ngenerate:\n  concurency: 10\n")
    result = eyas("config", "show", str(path))
    assert result.returncode == 2
    assert "generate.concurency: unknown key" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_error_naming_a_dataset_keeps_its_brackets(tmp_path):
    """Rich markup would read ``[qa]`` as a style and print ``datasets.source``: the key the user must fix."""
    path = tmp_path / "run.yaml"
    path.write_text("run_dir: out\ndatasets:\n  - {name: qa, source: missing.jsonl}\n")
    result = eyas("estimate", str(path))
    assert result.returncode == 2
    said = "".join(result.stderr.split())  # rich wraps a long path anywhere
    assert "error:datasets[qa].source:" in said and said.endswith("missing.jsonldoesnotexist")


def test_tune_and_scaling_refuse_bad_flags_by_name(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("run_dir: out\n")
    threads = eyas("tune", str(path), "--threads", "2,two")
    assert threads.returncode == 2 and "--threads: '2,two' is not comma-separated whole numbers" in threads.stderr
    budget = eyas("tune", str(path), "--budget-min", "0")
    assert budget.returncode == 2 and "budget_min: Input should be greater than 0" in budget.stderr
    tau = eyas("scaling", str(path), "--target-tau", "0.5")
    assert tau.returncode == 2 and "target_tau" in tau.stderr and "above 1" in tau.stderr
    assert "Traceback" not in threads.stderr + budget.stderr + tau.stderr
