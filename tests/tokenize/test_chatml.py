"""chatml and auto on the real SmolLM2 tokenizer, proven against ids the real model sampled."""

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from eyas import generate, tokenize
from eyas.config import ConfigError, load_config
from eyas.generate.store import read_records
from eyas.paths import RunPaths
from eyas.records import TOKENIZED_COLUMNS, GenerationRecord, Usage
from eyas.space import EXIT_CODE as DISK_FULL
from eyas.stage import digest, read_marker
from eyas.tokenize.auto import AutoFormat
from eyas.tokenize.encoders import HFEncoder
from eyas.tokenize.formats import FORMATS
from eyas.tokenize.rebuild import Rebuilder
from eyas.tokenize.verify import compare
from tests.conftest import ROOT, write_jsonl
from tests.disks import fill, small_disk
from tests.kills import kill_at_each

QUESTIONS = ["What is 2+2? Answer with one number.", "Say hello.", "Reply with the word yes.", "Name a color."]
GOLDEN = Path(__file__).parent / "golden" / "chatml_smollm2.json"


def write_config(root: Path, name: str = "run.yaml", **tokenize_settings) -> Path:
    data = {
        "run_dir": "run",
        "target": {"model": "embedded", "device": "cpu"},
        "datasets": [{"name": "qa", "source": "prompts.jsonl"}],
        "generate": {"backend": "local", "max_tokens": 16, "batch_size": 4},
        "tokenize": {"format": "chatml", **tokenize_settings},
    }
    path = root / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """A run dir with records the real embedded model generated (greedy, 16 tokens at most)."""
    root = tmp_path_factory.mktemp("tok")
    write_jsonl(root / "prompts.jsonl", [{"prompt": q} for q in QUESTIONS])
    config = load_config(write_config(root))
    generate.run(config, quiet=True)
    return root, config


def records_of(config) -> list[GenerationRecord]:
    return list(read_records(RunPaths.of(config).generations("qa")))


@pytest.mark.slow
def test_rebuild_equals_the_sampled_ids(generated, tokenizer):
    root, config = generated
    report = tokenize.run(config, quiet=True, verify_ids=True)["datasets"]["qa"]
    records = records_of(config)
    assert report["verified"] == len(records) == 4
    assert report["verified_by_finish"]["stop"][0] >= 1
    assert report["verify_exact_rate"] == 1.0 and report["mismatches"] == []
    assert report["billing_exact_rate"] == 1.0 and report["prompt_exact"] == 4
    table = pq.read_table(RunPaths.of(config).tokenized("qa"))
    assert tuple(table.column_names) == TOKENIZED_COLUMNS
    assert str(table.schema.field("input_ids").type) == "list<element: int32>"
    assert str(table.schema.field("loss_mask").type) == "list<element: uint8>"
    by_id = {r.id: r for r in records}
    for row in table.to_pylist():
        rec = by_id[row["id"]]
        prompt = tokenizer.encode(
            tokenizer.apply_chat_template(rec.messages, add_generation_prompt=True, tokenize=False),
            add_special_tokens=False,
        )
        assert row["input_ids"] == prompt + rec.token_ids
        assert row["loss_mask"] == [0] * len(prompt) + [1] * len(rec.token_ids)
        assert row["completion_tokens"] == row["billed_completion_tokens"] == len(rec.token_ids)
        assert (row["input_ids"][-1] == 2) == (row["finish_reason"] == "stop")


@pytest.mark.slow
def test_rerun_skips_and_changed_settings_rebuild(generated):
    root, config = generated
    tokenize.run(config, quiet=True)
    out = RunPaths.of(config).tokenized("qa")
    before = out.stat().st_mtime_ns
    tokenize.run(config, quiet=True)
    assert out.stat().st_mtime_ns == before
    changed = config.model_copy(update={"tokenize": config.tokenize.model_copy(update={"on_mismatch": "drop"})})
    tokenize.run(changed, quiet=True)
    assert out.stat().st_mtime_ns != before
    assert not out.with_name(out.name + ".tmp").exists()


def test_auto_agrees_with_chatml(generated, tokenizer):
    _, config = generated
    records = records_of(config)
    encoder = HFEncoder(tokenizer)
    auto, _ = Rebuilder(AutoFormat(encoder)).rebuild(records)
    chatml, _ = Rebuilder(FORMATS["chatml"](encoder)).rebuild(records)
    assert [(s.prompt_ids, s.completion_ids) for s in auto] == [(s.prompt_ids, s.completion_ids) for s in chatml]
    assert AutoFormat(encoder).layout.end_of_turn == "<|im_end|>"


def test_on_mismatch_drop_lists_each_dropped_sample(generated, tmp_path):
    root, config = generated
    records = records_of(config)
    bad = replace(records[0], usage=Usage(completion_tokens=len(records[0].token_ids) + 9))
    run_dir = tmp_path / "run"
    path = RunPaths(run_dir).generations("qa")
    path.parent.mkdir(parents=True)
    path.write_text("".join(r.to_json() + "\n" for r in [bad, *records[1:]]))
    for policy, kept in (("flag", 4), ("drop", 3)):
        cfg = config.model_copy(
            update={"run_dir": str(run_dir), "tokenize": config.tokenize.model_copy(update={"on_mismatch": policy})}
        )
        report = tokenize.run(cfg, quiet=True)["datasets"]["qa"]
        table = pq.read_table(RunPaths(run_dir).tokenized("qa")).to_pylist()
        assert len(table) == report["samples"] == kept
    assert report["dropped"] == [
        {"id": bad.id, "reason": f"rebuilt {len(bad.token_ids)} completion tokens, billed {len(bad.token_ids) + 9}"}
    ]
    assert report["billing_exact_rate"] == 0.75


def test_mismatch_names_position_tokens_and_cause(tokenizer):
    """A sampled non-canonical split of `Hello` rebuilds canonically: reported, not hidden."""
    encoder = HFEncoder(tokenizer)
    fmt = FORMATS["chatml"](encoder)
    hello = tokenizer.encode("Hello", add_special_tokens=False)
    split = tokenizer.encode("H", add_special_tokens=False) + tokenizer.encode("ello", add_special_tokens=False)
    assert len(hello) == 1 and len(split) == 2
    rec = GenerationRecord(
        id="qa/x",
        dataset="qa",
        prompt_id="x",
        messages=[{"role": "user", "content": "Hi"}],
        content="Hello",
        finish_reason="stop",
        usage=Usage(completion_tokens=3),
        model="m",
        provider="local",
        created=0.0,
        token_ids=split + [2],
    )
    (sample,), _ = Rebuilder(fmt).rebuild([rec])
    mismatch = compare(sample, encoder)
    assert (mismatch.position, mismatch.truth_token, mismatch.rebuilt_token) == (0, "H", "Hello")
    assert mismatch.cause == "non-canonical-merge"
    assert sample.flags == ["billing-mismatch"]


def test_golden_chatml_ids():
    """Literal `<|im_end|>` in content stays text; Qwen-style tool calls; the turn ends with id 2."""
    from eyas.config import TargetConfig
    from eyas.target import load_tokenizer

    golden = json.loads(GOLDEN.read_text())
    encoder = HFEncoder(load_tokenizer(TargetConfig(model="embedded", device="cpu")))
    records = [GenerationRecord.from_dict(c["record"]) for c in golden]
    samples, dropped = Rebuilder(FORMATS["chatml"](encoder)).rebuild(records)
    assert dropped == []
    for case, sample in zip(golden, samples):
        assert sample.prompt_ids + sample.completion_ids == case["input_ids"], case["name"]
        assert sample.flags == case["flags"], case["name"]


def test_auto_refuses_a_template_that_is_not_prefix_stable(target_config):
    from eyas.target import load_tokenizer

    tok = load_tokenizer(target_config)
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ 'bot' if m['role'] == 'assistant' else m['role'] }}\n"
        "{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(ConfigError, match="not prefix-stable"):
        AutoFormat(HFEncoder(tok))


def test_auto_places_reasoning_the_way_the_template_renders_it(target_config):
    from eyas.target import load_tokenizer

    tok = load_tokenizer(target_config)
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}\n</think>\n\n{% endif %}"
        "{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    encoder = HFEncoder(tok)
    rec = GenerationRecord(
        id="qa/r",
        dataset="qa",
        prompt_id="r",
        messages=[{"role": "user", "content": "2+2?"}],
        content="4",
        reasoning="Add them.",
        finish_reason="stop",
        usage=Usage(),
        model="m",
        provider="p",
        created=0.0,
    )
    (sample,), _ = Rebuilder(AutoFormat(encoder)).rebuild([rec])
    assert encoder.decode(sample.completion_ids) == "<think>\nAdd them.\n</think>\n\n4<|im_end|>"


def test_cli_names_the_problem_and_exits_2(generated, tmp_path):
    root, _ = generated
    path = write_config(root, "kimi.yaml", format="kimi-k2.5")
    done = subprocess.run(
        [sys.executable, "-m", "eyas", "tokenize", str(path)], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 2
    assert "error:" in done.stderr and "tiktoken.model" in done.stderr


def test_a_bad_record_line_names_file_and_line_and_keeps_earlier_output(generated, tmp_path):
    from eyas.jsonl import JsonlError

    _, config = generated
    records = records_of(config)
    cfg = config.model_copy(update={"run_dir": str(tmp_path / "run")})
    path = RunPaths.of(cfg).generations("qa")
    path.parent.mkdir(parents=True)
    path.write_text(records[0].to_json() + "\n")
    tokenize.run(cfg, quiet=True)
    out = RunPaths.of(cfg).tokenized("qa")
    before = out.read_bytes()
    path.write_text(records[0].to_json() + "\n" + json.dumps({"id": "qa/broken"}) + "\n")
    with pytest.raises(JsonlError, match=r"qa\.jsonl:2: not a generation record"):
        tokenize.run(cfg, quiet=True)
    assert out.read_bytes() == before and not out.with_name(out.name + ".tmp").exists()


def test_a_seam_where_joint_encoding_differs_is_flagged(tokenizer):
    """`assistant\\n` + `  Hi`: jointly the pre-tokenizer makes `\\n ` + ` Hi`, separately `\\n` | ` ` + ` Hi`."""
    fmt = FORMATS["chatml"](HFEncoder(tokenizer))

    def flags(content):
        rec = GenerationRecord(
            id="qa/s",
            dataset="qa",
            prompt_id="s",
            messages=[{"role": "user", "content": "Hi"}],
            content=content,
            finish_reason="stop",
            usage=Usage(),
            model="m",
            provider="p",
            created=0.0,
        )
        return Rebuilder(fmt).rebuild([rec])[0][0].flags

    assert "seam-differs" in flags("  Hi there")
    assert "seam-differs" not in flags("Hi there")


def test_a_turn_ended_by_a_stop_string_has_no_end_of_turn(generated, tokenizer):
    """With `generate.stop` set, a `stop` answer may carry no end-of-turn id; billing says which.
    Without stop strings that reading is never tried (it would only hide a non-canonical merge)."""
    _, config = generated
    rec = next(r for r in records_of(config) if r.finish_reason == "stop")
    cut = replace(rec, token_ids=rec.token_ids[:-1], usage=Usage(completion_tokens=len(rec.token_ids) - 1))
    encoder = HFEncoder(tokenizer)
    (sample,), _ = Rebuilder(FORMATS["chatml"](encoder), stop_strings=True).rebuild([cut])
    assert sample.completion_ids == cut.token_ids
    assert sample.flags == ["stop-string"] and compare(sample, encoder) is None
    (without,), _ = Rebuilder(FORMATS["chatml"](encoder)).rebuild([cut])
    assert "billing-mismatch" in without.flags and without.completion_ids[-1] == 2


def tokenized_files(paths: RunPaths) -> dict:
    """Tokenize's outputs on disk (the run directory written as ``<run>``), its marker by digest."""
    files = [paths.tokenized("qa"), paths.tokenize_done("qa"), paths.tokenize_report]
    marker = read_marker(paths.marker("tokenize"))
    return {f.name: f.read_bytes().replace(bytes(paths.root), b"<run>") if f.exists() else None for f in files} | {
        "marker": digest(marker) if marker else None
    }


def redo_ready(root: Path, generated) -> tuple[RunPaths, Path, dict]:
    """The module's records in ``root/run``, tokenized; a config file that redoes them
    (``on_mismatch: drop``); and the files an uninterrupted redo writes (in a copy)."""
    root.mkdir(exist_ok=True)
    shutil.copy(generated[0] / "prompts.jsonl", root)
    shutil.copytree(generated[0] / "run" / "generate", root / "run" / "generate")
    tokenize.run(load_config(write_config(root, "old.yaml")), quiet=True)
    path = write_config(root, "new.yaml", on_mismatch="drop")
    uninterrupted = shutil.copytree(root, root.with_name(root.name + "-uninterrupted"))
    tokenize.run(load_config(uninterrupted / "new.yaml"), quiet=True)
    return RunPaths(root / "run"), path, tokenized_files(RunPaths(uninterrupted / "run"))


@pytest.mark.slow
def test_a_tokenize_killed_at_any_point_is_never_vouched_for_and_the_rerun_is_an_uninterrupted_one(generated, tmp_path):
    paths, path, uninterrupted = redo_ready(tmp_path, generated)
    old = tokenized_files(paths)
    aside = paths.tokenized("qa").with_name("qa.parquet.tmp")
    kill_points = [
        lambda: not paths.marker("tokenize").exists(),
        lambda: aside.exists(),
        lambda: paths.tokenize_done("qa").read_bytes() != old["qa.done.json"],
    ]
    command = [sys.executable, "-m", "eyas", "tokenize", str(path), "-q"]

    # A kill leaves the old outputs with their marker, or no marker (nothing vouched for): both
    # read as "old" here; anything else under a marker must be the new outputs, whole.
    def vouched() -> dict:
        return old if tokenized_files(paths)["marker"] is None else tokenized_files(paths)

    seen = kill_at_each(command, kill_points, vouched, old, cwd=ROOT)
    if seen[-1] == "new":
        assert tokenized_files(paths) == uninterrupted
    assert subprocess.run(command, cwd=ROOT).returncode == 0
    assert tokenized_files(paths) == uninterrupted != old
    assert not aside.exists()


@pytest.mark.slow
def test_a_tokenize_on_a_full_disk_exits_7_naming_its_file_and_the_rerun_is_an_uninterrupted_one(generated, tmp_path):
    """A first tokenize: a redo of the same records would fit in the room its old files give back."""
    root, _ = generated
    uninterrupted = tmp_path / "uninterrupted"
    shutil.copytree(root / "run" / "generate", uninterrupted / "run" / "generate")
    shutil.copy(root / "prompts.jsonl", uninterrupted)
    with small_disk(tmp_path / "disk", "16M") as disk:
        shutil.copytree(uninterrupted, disk, dirs_exist_ok=True)
        path = write_config(disk)
        tokenize.run(load_config(write_config(uninterrupted)), quiet=True)
        paths = RunPaths(disk / "run")
        ballast = fill(disk)
        command = [sys.executable, "-m", "eyas", "tokenize", str(path), "-q"]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        said = "".join((done.stdout + done.stderr).split())  # rich wraps a long path anywhere
        assert done.returncode == DISK_FULL, said
        aside = paths.tokenized("qa").with_name("qa.parquet.tmp")
        assert f"thediskisfullwriting{aside}" in said and "Traceback" not in said, said
        assert not aside.exists(), "the file it could not finish gives its room back"
        assert tokenized_files(paths) == dict.fromkeys(["qa.parquet", "qa.done.json", "report.json", "marker"])
        ballast.unlink()
        assert subprocess.run(command, cwd=ROOT).returncode == 0
        assert tokenized_files(paths) == tokenized_files(RunPaths(uninterrupted / "run"))
