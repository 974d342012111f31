"""The drafter in llama.cpp: the GGUF export served as its README says, eval's speed rows, and the
layer numbering llama.cpp reads (built by ``make llamacpp``, which ``make test`` runs: no skips)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
import torch

from eyas.config import TargetConfig, load_config, parse_config
from eyas.drafter.families import family_of, save_drafter
from eyas.paths import RunPaths
from eyas.target.llamacpp import LlamaServer, convert, find_llamacpp, target_ggufs
from tests.conftest import write_jsonl
from tests.servers import served
from tests.train.conftest import load_tiny

from .overfit import OVERFIT_NEW, TEXTS, distinct_layers_target, engine_eval_config, overfit_drafter
from .test_eagle import _misnumbered_copy

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def llamacpp():
    return find_llamacpp(None)


def _greedy_in_llamacpp(server: LlamaServer, prompts: list[list[int]]) -> tuple[list[list[int]], float]:
    """Each prompt's greedy tokens, and τ from llama.cpp's own counters (1 + accepted ÷ verification steps)."""
    outputs = [server.complete(p, OVERFIT_NEW)["tokens"] for p in prompts]
    counters = server.counters()
    drafts = counters.get("num_drafts", 0.0)
    return outputs, 1 + counters.get("num_accepted_tokens", 0.0) / drafts if drafts else 1.0


@pytest.mark.parametrize("gguf_type", [None, "q8_0"])
def test_the_gguf_export_serves_as_its_readme_says_with_the_targets_greedy_outputs(
    gguf_type, llamacpp, overfit, tmp_path
):
    """In the target's precision (f32 here) and in a smaller type (``export.gguf_type``): the
    target verifies every drafted token, so its greedy outputs are its own either way."""
    prompts, greedy, _, drafter = overfit
    run_dir = tmp_path / "run"
    save_drafter(drafter, run_dir / "train" / "final")
    import eyas.export

    config = load_tiny(run_dir)
    config = config.model_copy(update={"export": config.export.model_copy(update={"gguf_type": gguf_type})})
    out = eyas.export.export_one(config, "gguf")
    readme = (out / "README.md").read_text()
    command = re.search(r"```bash\n(.+?)\n```", readme, re.S).group(1).replace("\\\n", " ")
    assert "--spec-type draft-eagle3 --spec-draft-n-max 3" in command and str(out / "draft.gguf") in command
    assert "-f32.gguf" in command, "the target in its checkpoint's precision (f32 for the embedded target)"
    assert f"drafter in {gguf_type or 'f32'}, target in f32" in readme
    if gguf_type == "q8_0":
        f32_draft = eyas.export.export_one(load_tiny(run_dir), "gguf", tmp_path / "f32") / "draft.gguf"
        assert (out / "draft.gguf").stat().st_size < 0.4 * f32_draft.stat().st_size
    with served(command + " --metrics -t 2", timeout_s=120) as base:
        for prompt, reference in zip(prompts, greedy):
            body = {"prompt": prompt, "n_predict": OVERFIT_NEW, "temperature": 0, "return_tokens": True}
            request = urllib.request.Request(f"{base}/completion", json.dumps(body).encode())
            answer = json.loads(urllib.request.urlopen(request, timeout=120).read())
            assert answer["tokens"] == reference[: len(answer["tokens"])] and answer["timings"]["draft_n"] > 0


def test_eval_in_llamacpp_measures_speed_and_agrees_with_eyas(overfit, tmp_path):
    from eyas import eval as stage

    config = engine_eval_config(tmp_path, overfit[3], "engine: llamacpp, llamacpp_repeats: 2")
    report = stage.run(load_config(config), quiet=True)
    section = report["llamacpp"]
    drafted = [f"eagle3, n={n}{p_min}" for p_min in ("", ", p-min=0.5") for n in (1, 2, 3)]
    assert list(section["methods"]) == [*drafted, "ngram-mod", "ngram-simple"]
    assert len(section["plain"]["tokens_per_s_rounds"]) == 2 and section["plain"]["tokens_per_s"] > 0
    for name, m in section["methods"].items():
        assert m["lossless"] == {"checked": 6, "identical": 6, "float_ties": [], "mismatched": []}, name
        assert m["speedup"] == pytest.approx(m["tokens_per_s"] / section["plain"]["tokens_per_s"])
    # The same drafter at the same draft length accepts what it accepts in eyas's own decoder, but
    # for each prompt's last round, whose drafts llama.cpp counts past n_predict (as vLLM does: at
    # most k a prompt, see eyas.eval.vllm_engine) — large on 16-token answers, small on real ones.
    eyas = report["methods"]["eagle3"]
    difference = section["methods"]["eagle3, n=3"]["tau"] - eyas["tau"]
    assert -0.02 <= difference <= 0.02 + 3 * len(TEXTS) / eyas["target_passes"]
    assert section["best_draft"] in section["methods"] and (tmp_path / "run" / "eval" / "acceptance.png").is_file()
    again = stage.run(load_config(tmp_path / "run.yaml"), quiet=True)
    assert again["llamacpp"]["plain"] == section["plain"], "a rerun reads the measured figures back"


@pytest.mark.parametrize("family", ["dflash", "dspark", "dflash2"])
def test_a_block_drafter_export_serves_in_llamacpp_losslessly_and_accepts_what_eyas_measures(family, request, tmp_path):
    """Asked for 5 draft tokens, a drafter of block size 4 is served and measured at what one
    block drafts — DFlash's and DFlash2's 3, DSpark's 4 (every position drafts) — as the export's
    README serves it (no row is a longer draft in name only: llama.cpp would clamp it). The DSpark
    drafter has a reduced vocabulary and its Markov and confidence heads: llama.cpp's converter
    takes it as written (``d2t`` included), and ``draft-dspark`` chains the Markov head as eyas's
    decoder does. The DFlash2 drafter's convolutions and selector are read as written too, and
    llama.cpp walks its selector as eyas's decoder does."""
    import eyas.export
    from eyas import eval as stage

    drafter = request.getfixturevalue(f"overfit_{family}_drafter")
    per_block = drafter.spec.draft_length(5)
    run_dir = tmp_path / "trained"
    save_drafter(drafter, run_dir / "train" / "final")
    out = eyas.export.export_one(load_tiny(run_dir, drafter=family), "gguf")
    spec_type = family_of(drafter.spec).llamacpp_spec_type
    assert f"--spec-type {spec_type} --spec-draft-n-max 3" in (out / "README.md").read_text()

    config = engine_eval_config(tmp_path, drafter, "engine: llamacpp, llamacpp_repeats: 1", 5)
    report = stage.run(load_config(config), quiet=True)
    section = report["llamacpp"]
    drafted = [f"{family}, n={n}" for n in range(1, per_block + 1)]
    cut = [f"{name}, p-min=0.5" for name in drafted]
    assert list(section["methods"]) == [*drafted, *cut, "ngram-mod", "ngram-simple"]
    served_log = (tmp_path / "run" / "eval" / f"llama-server-{family}-n{per_block}-p-min0.5.log").read_text()
    assert "p_min=0.50" in served_log, "the threshold reaches the server (DSpark's: its confidence head)"
    for name, m in section["methods"].items():
        assert m["lossless"] == {"checked": 3, "identical": 3, "float_ties": [], "mismatched": []}, name
    eyas_tau = report["methods"][family]["tau"]
    assert eyas_tau > 1.5, "the overfit drafter is accepted in eyas's own decoder"
    # As for EAGLE-3: llama.cpp counts each prompt's last round's drafts past n_predict.
    difference = section["methods"][drafted[-1]]["tau"] - eyas_tau
    slack = per_block * len(TEXTS) / report["methods"][family]["target_passes"]
    assert -0.02 <= difference <= 0.02 + slack, difference


def test_eagle3_1_with_norm_before_fc_serves_in_llamacpp_and_norm_output_is_refused(model, overfit, tmp_path):
    """EAGLE-3.1's norm before ``fc`` and speculators' normed residual are read by llama.cpp: served
    losslessly, accepted as in eyas's own decoder. EAGLE-3.1's post-norm feedback and per-layer
    ``fc_norm`` are not (the pinned graph feeds the pre-norm state back and has no per-layer norm),
    so a drafter trained with them gets no GGUF export and no llama.cpp eval, and the error says why."""
    import eyas.export
    from eyas import eval as stage
    from eyas.config import ConfigError

    prompts, greedy, _, _ = overfit
    sequences = [p + g for p, g in zip(prompts, greedy)]
    normed = overfit_drafter(model, sequences, eagle3={"norm_before_fc": True, "norm_before_residual": True})
    config = engine_eval_config(tmp_path / "fc", normed, "engine: llamacpp, llamacpp_repeats: 1")
    report = stage.run(load_config(config), quiet=True)
    section, own = report["llamacpp"], report["methods"]["eagle3"]
    for name, m in section["methods"].items():
        assert m["lossless"] == {"checked": 3, "identical": 3, "float_ties": [], "mismatched": []}, name
    assert own["tau"] > 1.5, "the overfit drafter is accepted in eyas's own decoder"
    difference = section["methods"]["eagle3, n=3"]["tau"] - own["tau"]
    assert -0.02 <= difference <= 0.02 + 3 * len(TEXTS) / own["target_passes"], difference

    fed_back = overfit_drafter(model, sequences, steps=2, eagle3={"fc_norm": True, "norm_output": True})
    save_drafter(fed_back, tmp_path / "run" / "train" / "final")
    with pytest.raises(ConfigError, match=r"does not read fc_norm, norm_output .*train.eagle3.fc_norm"):
        eyas.export.export_one(load_tiny(tmp_path / "run"), "gguf")
    config = engine_eval_config(tmp_path / "out", fed_back, "engine: llamacpp")
    with pytest.raises(ConfigError, match="does not read fc_norm, norm_output"):
        stage.run(load_config(config), quiet=True)


def test_plain_decoding_reports_its_top_two_tokens_for_the_tie_check(llamacpp, tokenizer, tmp_path):
    """The lossless check reads llama.cpp's top two log-probabilities at every decoded token; greedy,
    the first of them is the token decoded, and the second is no more likely."""
    target = target_ggufs(TargetConfig(), llamacpp, "f32").same_precision
    prompt = tokenizer("The capital of France is")["input_ids"]
    with LlamaServer(llamacpp, ["-m", str(target), "--no-warmup"], tmp_path / "plain.log", 120, 2) as server:
        answer = server.complete(prompt, 8, n_probs=2)
    top2 = [t["top_logprobs"] for t in answer["completion_probabilities"]]
    assert [t[0]["id"] for t in top2] == answer["tokens"] and len(top2) == 8
    assert all(len(t) == 2 and t[0]["logprob"] >= t[1]["logprob"] for t in top2)


def test_an_export_read_with_shifted_layer_ids_loses_acceptance_in_llamacpp(llamacpp, tokenizer, tmp_path):
    """llama.cpp reads the top-level ids as the input of each layer, as vLLM does: the same weights
    with the ids one lower (the numbering eyas wrote before the fix) must accept less. A small
    target whose layers each move the residual stream a lot (init std 1.0) makes the loss plain."""
    from eyas.speculate.decode import TargetRunner, greedy_decode

    target = distinct_layers_target(
        len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id
    )
    target.save_pretrained(tmp_path / "target")
    tokenizer.save_pretrained(tmp_path / "target")
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 512, (12,), generator=generator).tolist() for _ in range(3)]
    with TargetRunner(target) as runner:
        greedy = [greedy_decode(runner, p, OVERFIT_NEW, set()).tokens for p in prompts]
    drafter = overfit_drafter(target, [p + g for p, g in zip(prompts, greedy)], steps=60)
    save_drafter(drafter, tmp_path / "draft")
    ggufs = target_ggufs(TargetConfig(model=str(tmp_path / "target")), llamacpp, "f32")
    taus, outputs = {}, {}
    for name, directory in (
        ("as written", tmp_path / "draft"),
        ("shifted", _misnumbered_copy(drafter, tmp_path / "s")),
    ):
        draft = convert(llamacpp, directory, tmp_path / f"{name}.gguf", "f32", target_dir=ggufs.hf_dir)
        args = ["-m", str(ggufs.same_precision), "-md", str(draft), "--spec-type", "draft-eagle3", "--no-warmup"]
        with LlamaServer(llamacpp, args, tmp_path / f"{name}.log", 120, 2) as server:
            outputs[name], taus[name] = _greedy_in_llamacpp(server, prompts)
    # The target's own greedy outputs either way: only acceptance may change with the numbering.
    assert outputs["as written"] == outputs["shifted"]
    print(f"llama.cpp τ: layers as written {taus['as written']:.2f}, read one lower {taus['shifted']:.2f}")
    # Read one lower, the drafter keeps less than half of what it gains over one token per pass.
    assert taus["shifted"] - 1.0 < (taus["as written"] - 1.0) / 2


def test_a_missing_llamacpp_names_make_llamacpp(monkeypatch, tmp_path):
    from eyas.config import ConfigError

    monkeypatch.setenv("EYAS_LLAMACPP", str(tmp_path))
    with pytest.raises(ConfigError, match=r"EYAS_LLAMACPP: .* is not a built llama.cpp tree"):
        find_llamacpp(None)
    with pytest.raises(ConfigError, match="eval.engine"):
        parse_config({"run_dir": str(tmp_path), "eval": {"engine": "llama.cpp"}})
    assert RunPaths(tmp_path).export_gguf == tmp_path / "export" / "gguf" / "draft.gguf"


def _served_files(monkeypatch) -> list[dict]:
    """Stands in for llama.cpp's timed rounds (servers, minutes) and records what each measurement
    would have served: the target GGUF and every configuration's server arguments."""
    from eyas.eval import llamacpp_engine

    measured = []

    def measure(config, llamacpp, target, configs, prompts, out_dir, server_args=()):
        measured.append({"target": target, "configs": configs})
        plain = {"tokens_per_s": 1.0, "tokens_per_s_rounds": [1.0]}
        return {"engine": "llama.cpp", "target": str(target), "plain": plain, "methods": {}, "best_draft": None}

    monkeypatch.setattr(llamacpp_engine, "measure", measure)
    return measured


def test_eval_in_llamacpp_measures_the_files_the_gguf_exports_readme_serves(overfit, tmp_path, monkeypatch):
    """`eyas eval --engine llamacpp` times the GGUF files `eyas export --format gguf` writes and its
    README's command serves (same digests), in the precision the checkpoint declares (f32 for
    the embedded target) even where eyas computes in another (here bfloat16)."""
    import eyas.export
    from eyas import eval as stage
    from eyas.stage import file_digest

    measured = _served_files(monkeypatch)
    write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": t} for t in TEXTS[:1]])
    (tmp_path / "run.yaml").write_text(
        "run_dir: run\n"
        "target: {model: embedded, device: cpu, dtype: bfloat16}\n"
        f"eval: {{engine: llamacpp, num_draft_tokens: 2, max_new_tokens: {OVERFIT_NEW}, prompts: prompts.jsonl,"
        " broken_control: false}\n"
    )
    config = load_config(tmp_path / "run.yaml")
    save_drafter(overfit[3], tmp_path / "run" / "train" / "final")
    eyas.export.export_one(config, "sglang")
    readme = (eyas.export.export_one(config, "gguf") / "README.md").read_text()
    command = re.search(r"```bash\n(.+?)\n```", readme, re.S).group(1).split()
    served_target, served_draft = command[command.index("-m") + 1], command[command.index("-md") + 1]

    stage.run(config, quiet=True)
    [run] = measured
    drafts = {args[args.index("-md") + 1] for name, args in run["configs"].items() if "-md" in args}
    assert len(drafts) == 1 and "-f32.gguf" in served_target
    assert file_digest(run["target"]) == file_digest(Path(served_target))
    assert file_digest(Path(drafts.pop())) == file_digest(Path(served_draft))


def test_a_llamacpp_timing_is_reused_only_by_the_build_threads_and_machine_that_measured_it(
    overfit, tmp_path, monkeypatch
):
    """A rerun reads its figures back; another llama-server build, thread count or host measures
    anew, so a comparison never sets one build's or machine's timings beside another's."""
    import platform

    from eyas import eval as stage
    from eyas.eval import llamacpp_engine
    from eyas.target.llamacpp import LlamaCpp

    measured = _served_files(monkeypatch)
    config = load_config(engine_eval_config(tmp_path, overfit[3], "engine: llamacpp"))
    stage.run(config, quiet=True)
    stage.run(config, quiet=True)
    assert len(measured) == 1, "the same build, threads and host read the figures back"
    monkeypatch.setattr(platform, "node", lambda: "another-host")
    stage.run(config, quiet=True)
    assert len(measured) == 2, "another machine"
    monkeypatch.setattr(llamacpp_engine, "server_threads", lambda: 64)
    stage.run(config, quiet=True)
    assert len(measured) == 3, "another thread count"
    # What a build's identity covers is tested with the converter's (tests/target/test_llamacpp_cache.py).
    monkeypatch.setattr(LlamaCpp, "build_identity", lambda self: "another build")
    section = stage.run(config, quiet=True)["llamacpp"]
    assert len(measured) == 4, "another llama-server build"
    assert section["measured_by"] == {"llama-server": "another build", "threads": 64, "host": "another-host"}


def test_a_llama_server_killed_mid_eval_names_its_log_and_the_rerun_keeps_eyas_own_results(overfit, tmp_path):
    """An engine child dying mid-stage must stop eval with its log named (exit 1), keep what eyas
    decoded itself before it, and let the rerun measure llama.cpp afresh and finish."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT
    from tests.kills import kill_engine_child

    config = engine_eval_config(tmp_path, overfit[3], "engine: llamacpp, llamacpp_repeats: 1")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "400"}
    command = [sys.executable, "-m", "eyas", "eval", str(config), "-q"]
    killed, returncode, said = kill_engine_child(command, lambda: True, env=env, cwd=tmp_path)
    assert killed is not None, "the kill must land while eval serves the drafter in llama.cpp"
    assert returncode == 1 and re.search(r"llama-server \S+ .*last lines of \S+llama-server-\S+\.log", said), said
    (results,) = (tmp_path / "run" / "eval").glob("results-*.jsonl")
    decoded = results.read_text()
    methods = [json.loads(line)["method"] for line in decoded.splitlines()]
    assert {"plain", "eagle3"} <= set(methods) and len(methods) == len(set(methods)) * len(TEXTS), (
        "eyas's own decoding of every prompt finished first"
    )

    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert results.read_text() == decoded, "the rerun decodes nothing eyas had decoded"
    report = json.loads((tmp_path / "run" / "eval" / "report.json").read_text())
    assert report["llamacpp"]["plain"]["tokens_per_s"] > 0
