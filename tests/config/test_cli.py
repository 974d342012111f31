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
