"""``eyas.eval.run`` end to end: report, plot, lossless check, resume, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eyas.config import load_config
from eyas.drafter.families import save_drafter
from eyas.stage import StageError
from tests.conftest import write_jsonl

from .overfit import OVERFIT_NEW, TEXTS


@pytest.fixture(scope="module")
def run_setup(tmp_path_factory, overfit):
    root = tmp_path_factory.mktemp("evalrun")
    drafter = overfit[3]
    save_drafter(drafter, root / "draft")
    write_jsonl(root / "prompts.jsonl", [{"prompt": t} for t in TEXTS[:2]])
    (root / "run.yaml").write_text(
        "run_dir: run\n"
        "target: {model: embedded, device: cpu}\n"
        f"eval: {{num_draft_tokens: 3, max_new_tokens: {OVERFIT_NEW}, prompts: prompts.jsonl, draft: draft}}\n"
    )
    return root


@pytest.mark.slow
def test_run_writes_report_and_plot_and_resumes(run_setup):
    from eyas import eval as stage

    config = load_config(run_setup / "run.yaml")
    report = stage.run(config, quiet=True)
    out = run_setup / "run" / "eval"
    assert json.loads((out / "report.json").read_text()) == report
    assert (out / "acceptance.png").stat().st_size > 10_000
    methods = report["methods"]
    assert set(methods) == {"prompt_lookup", "eagle3", "eagle3_broken_aux_order"}
    for m in methods.values():
        assert m["lossless"] == {"checked": 2, "identical": 2, "mismatched": []}
        assert len(m["per_position"]) == 3 and m["tau_per_dataset"].keys() == {"prompts"}
    assert methods["eagle3"]["tau"] > methods["eagle3_broken_aux_order"]["tau"]
    rates = methods["eagle3"]["per_position"]
    assert rates[0] > 0 and rates == sorted(rates, reverse=True)  # position i+1 accepted only after i

    results = list(out.glob("results-*.jsonl"))
    assert len(results) == 1 and len(results[0].read_text().splitlines()) == 2 * 4
    again = stage.run(config, quiet=True)
    assert len(results[0].read_text().splitlines()) == 2 * 4  # nothing decoded twice
    assert again["methods"]["eagle3"]["tau"] == methods["eagle3"]["tau"]


def test_missing_drafter_is_a_clear_error(run_setup, tmp_path):
    from eyas import eval as stage

    config, name = stage.with_overrides(load_config(run_setup / "run.yaml"), draft=str(tmp_path))
    with pytest.raises(StageError, match="no drafter"):
        stage.run(config, quiet=True, name=name)


def test_another_engines_missing_layout_names_the_export_that_writes_it(overfit, tmp_path):
    """``--engine vllm`` on a run that exports only SGLang's layout reads ``export/vllm``: the
    refusal names the command that writes that directory, and that command does."""
    import eyas.export
    from eyas import eval as stage
    from eyas.config import parse_config
    from tests.train.conftest import tiny_config

    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": t} for t in TEXTS[:1]])
    run = parse_config({**tiny_config(tmp_path / "run"), "eval": {"prompts": str(prompts), "max_new_tokens": 4}})
    save_drafter(overfit[3], tmp_path / "run" / "train" / "final")
    eyas.export.export_one(run, "sglang")
    config, name = stage.with_overrides(run, engine="vllm")
    with pytest.raises(StageError, match=r"run `eyas export CONFIG --format vllm`, which writes it") as refused:
        stage.run(config, quiet=True, name=name)
    missing = str(tmp_path / "run" / "export" / "vllm")
    assert missing in str(refused.value)
    assert str(eyas.export.export_one(run, "vllm")) == missing and stage.draft_dir(config) == Path(missing)


@pytest.mark.slow
def test_other_prompts_get_a_report_of_their_own(run_setup, tmp_path):
    """``eyas eval --prompts OTHER`` once overwrote the run's report with figures on prompts its
    config does not name."""
    from eyas import eval as stage

    config = load_config(run_setup / "run.yaml")
    own = stage.run(config, quiet=True)
    other = write_jsonl(tmp_path / "code.jsonl", [{"prompt": TEXTS[2]}])
    named, name = stage.with_overrides(config, prompts=str(other))
    assert name == "code"
    report = stage.run(named, quiet=True, name=name)
    eval_dir = run_setup / "run" / "eval"
    assert report["prompts"] == 1 and json.loads((eval_dir / "code" / "report.json").read_text()) == report
    assert (eval_dir / "code" / "acceptance.png").is_file() and (eval_dir / "code" / "stage.json").is_file()
    assert json.loads((eval_dir / "report.json").read_text()) == own


@pytest.mark.slow
def test_an_edited_prompt_under_the_same_id_is_decoded_again(run_setup, tmp_path):
    """The per-prompt cache was keyed by the prompt file's name: a prompt edited under its old id
    kept its old outputs in the report."""
    from eyas import eval as stage

    prompts = write_jsonl(tmp_path / "ids.jsonl", [{"id": "q", "prompt": TEXTS[0]}])
    config, name = stage.with_overrides(load_config(run_setup / "run.yaml"), prompts=str(prompts))
    stage.run(config, quiet=True, name=name)
    write_jsonl(prompts, [{"id": "q", "prompt": TEXTS[1]}])
    stage.run(config, quiet=True, name=name)
    rows = [json.loads(line) for f in (run_setup / "run" / "eval" / name).glob("results-*.jsonl") for line in f.open()]
    assert len(rows) == 2 * 4 and len({r["prompt_digest"] for r in rows}) == 2
