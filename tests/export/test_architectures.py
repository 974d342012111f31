"""Tiny random-weight targets of six architectures through every stage, then into llama.cpp.

For each: ``eyas run`` (generate → tokenize → merge → train both drafter families → export →
eval) on the target, then ``eyas export --format gguf`` per family. Where eyas writes the
export, its README's command, run as written, must serve the target's own greedy outputs;
where eyas refuses, the reason must be the one read from llama.cpp's source, eval must refuse
too, and the command eyas declined to write must really abort the server on the first request.

Each outcome is a row of the table in docs/export.md, compared here; after a llama.cpp upgrade,
``EYAS_WRITE_DOCS=1 pytest tests/export/test_architectures.py`` rewrites the rows from the run.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from eyas import pipeline
from eyas.config import ConfigError, load_config
from eyas.drafter.families import family as drafter_family
from eyas.eval.llamacpp_engine import drafting, tie_margin
from eyas.target.llamacpp import LlamaCppError, LlamaServer, convert, find_llamacpp, target_ggufs
from eyas.target.llamacpp_support import serving_support
from tests.conftest import ROOT, write_jsonl
from tests.servers import served
from tests.tiny_targets import ARCHITECTURES, AUX_LAYERS, build_target

pytestmark = pytest.mark.slow

PROMPTS = ["Name a fruit.", "What is 3+3?", "Say hello.", "Name a color.", "Name a pet.", "Say yes."]
NEW_TOKENS = 8
DOC = ROOT / "docs" / "export.md"
FAMILIES = {"eagle3": "EAGLE-3", "dflash": "DFlash"}


@pytest.fixture(scope="module", autouse=True)
def own_cache(tmp_path_factory, tokenizer):
    """A cache of this module's own: the targets' GGUF conversions are made afresh each session
    (the tokenizer fixture is loaded first, from the shared cache)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EYAS_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


def write_run(root: Path, target: Path) -> Path:
    write_jsonl(root / "p.jsonl", [{"prompt": p} for p in PROMPTS])
    (root / "run.yaml").write_text(
        "run_dir: run\n"
        f"target: {{model: {target}, device: cpu}}\n"
        "datasets: [{name: tiny, source: p.jsonl}]\n"
        "generate: {max_tokens: 8, batch_size: 6}\n"
        "merge: {eval_count: 2}\n"
        f"extract: {{mode: online, aux_layers: {AUX_LAYERS}}}\n"
        "train: {drafter: [eagle3, dflash], ttt_steps: 2, draft_vocab_size: 256, intermediate_size: 64,"
        " max_steps: 2, batch_size: 2, checkpoint_every: 2, eval_every: 2, tau_new_tokens: 4}\n"
        "eval: {max_new_tokens: 6, num_draft_tokens: 2}\n"
    )
    return root / "run.yaml"


def complete(base: str, prompt: list[int], n_probs: int = 0) -> dict:
    body = {"prompt": prompt, "n_predict": NEW_TOKENS, "temperature": 0, "return_tokens": True, "n_probs": n_probs}
    request = urllib.request.Request(f"{base}/completion", json.dumps(body).encode())
    return json.loads(urllib.request.urlopen(request, timeout=120).read())


def plain_outputs(command: str, server: Path, prompts: list[list[int]]) -> list[dict]:
    """The target alone (the README command's ``-m``), with its top two tokens at every step."""
    target = re.search(r" -m (\S+)", command).group(1)
    with served(f"{server} -m {target} -t 2", timeout_s=120) as base:
        return [complete(base, p, n_probs=2) for p in prompts]


def serves_losslessly(command: str, prompts: list[list[int]], plain: list[dict]) -> bool:
    """The README's ``command`` decodes every prompt as the target alone does (``plain``), but
    where the two part at a float tie of the target's top two tokens (see
    :mod:`eyas.eval.llamacpp_engine`), and its drafter drafted."""
    with served(f"{command} --metrics -t 2", timeout_s=120) as base:
        drafted = [complete(base, p) for p in prompts]
    for spec, ref in zip(drafted, plain):
        top2 = [t["top_logprobs"] for t in ref["completion_probabilities"]]
        if spec["tokens"] != ref["tokens"] and tie_margin(ref["tokens"], spec["tokens"], top2, 1e-3) is None:
            return False
    return sum(a["timings"].get("draft_n", 0) for a in drafted) > 0


def aborts_on_first_request(view, tmp_path: Path, prompt: list[int]) -> bool:
    """The command eyas declined to write — the target and the drafter, converted as the export
    would, under ``--spec-type draft-FAMILY`` — started by hand: it dies on its first request."""
    import eyas.export

    llamacpp = find_llamacpp(None)
    ggufs = target_ggufs(view.target, llamacpp, "f32")
    layout = eyas.export.export_one(view, "vllm", tmp_path / "vllm")
    draft = convert(llamacpp, layout, tmp_path / "draft.gguf", "f32", target_dir=ggufs.hf_dir)
    args = [
        "-m",
        str(ggufs.same_precision),
        *drafting(draft, drafter_family(view.train.drafter).llamacpp_spec_type, 2),
        "--no-warmup",
    ]
    with LlamaServer(llamacpp, args, tmp_path / "refused.log", 120, 2) as server:
        try:
            server.complete(prompt, NEW_TOKENS)
        except LlamaCppError:
            return "layer input tensor is null" in (tmp_path / "refused.log").read_text()
    return False


def check_row(name: str, row: str) -> None:
    """docs/export.md's row for ``name`` is ``row``, or becomes it under ``EYAS_WRITE_DOCS=1``."""
    lines = DOC.read_text().splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith(f"| {name} |")), None)
    if os.environ.get("EYAS_WRITE_DOCS"):
        assert at is not None, f"docs/export.md has no row for {name} to rewrite"
        lines[at] = row
        DOC.write_text("\n".join(lines) + "\n")
    else:
        assert at is not None and lines[at] == row, (
            f"docs/export.md's row for {name} is not what this run found (EYAS_WRITE_DOCS=1 rewrites it):\n{row}"
        )


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_a_tiny_target_runs_every_stage_and_llamacpp_serves_it_or_eyas_says_why_not(name, tokenizer, tmp_path):
    import eyas.export
    from eyas import eval as stage

    target = build_target(name, tokenizer, tmp_path / name)
    config = load_config(write_run(tmp_path, target))
    results = pipeline.run(config, quiet=True)
    stages = ["generate", "tokenize", "merge"] + [f"{s} ({f})" for f in FAMILIES for s in ("train", "export", "eval")]
    assert set(stages) <= {s for s, r in results.items() if r["status"] == "ran"}, results
    for family in FAMILIES:
        report = json.loads((tmp_path / "run" / family / "eval" / "report.json").read_text())
        assert all(m["lossless"]["mismatched"] == [] for m in report["methods"].values()), (family, report)

    hf_config = json.loads((target / "config.json").read_text())
    prompts = [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": p}], add_generation_prompt=True, return_dict=True
            )["input_ids"]
        )
        for p in PROMPTS[:2]
    ]
    cells, plain, shown_abort = {}, None, False
    for view in config.drafter_views():
        drafter = drafter_family(view.train.drafter)
        support = serving_support(find_llamacpp(None).tree, hf_config, drafter.llamacpp_arch, drafter.title)
        try:
            out = eyas.export.export_one(view, "gguf")
        except ConfigError as refusal:
            assert support.serves is False and support.reason in str(refusal)
            override, report_name = stage.with_overrides(view, engine="llamacpp")
            with pytest.raises(ConfigError, match=re.escape(support.reason)):
                stage.run(override, quiet=True, name=report_name)
            # The graph is the reason, whatever the family: one family's abort shows it.
            shown_abort = shown_abort or aborts_on_first_request(view, tmp_path / "refused", prompts[0])
            assert shown_abort
            cells[drafter.name] = "refused: the graph sets no layer inputs (the server would abort)"
            continue
        except LlamaCppError as failure:
            # eyas wrote no command: llama.cpp's own converter cannot make the drafter's GGUF.
            assert "llama.cpp's converter failed" in str(failure)
            cells[drafter.name] = (
                f"not converted: llama.cpp's converter raises `{str(failure).splitlines()[-1].strip()}`"
            )
            continue
        command = re.search(r"```bash\n(.+?)\n```", (out / "README.md").read_text(), re.S).group(1)
        command = command.replace("\\\n", " ")
        plain = plain or plain_outputs(command, find_llamacpp(None).server, prompts)
        assert serves_losslessly(command, prompts, plain), (name, drafter.name, command)
        cells[drafter.name] = "served, lossless"
    row = (
        f"| {name} | `{hf_config['architectures'][0]}` | `{support.architecture}` (`{support.graph}`) | ran | "
        + " | ".join(cells[f] for f in FAMILIES)
        + " |"
    )
    check_row(name, row)


def test_the_table_lists_every_architecture_the_runs_cover():
    names = [line.split("|")[1].strip() for line in DOC.read_text().splitlines() if line.startswith("| ")]
    assert [n for n in names if n in ARCHITECTURES] == list(ARCHITECTURES)
