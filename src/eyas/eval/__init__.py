"""Stage 7 — eval: speculative decoding with the trained drafter, measured as a server would.

Consumes the target, the exported drafter (``--draft DIR``, default the export) and prompts
(the merge's held-out split, or ``eval.prompts`` / ``--prompts FILE`` in any stage-1 format).
Produces ``<run_dir>/eval/report.json`` (config, τ, per-position acceptance, τ per dataset,
speed with and without speculation, lossless check), ``acceptance.png`` and a printed table.

Methods, all with the same ``eval.num_draft_tokens``: plain decoding (reference output and
speed), prompt lookup (the baseline to beat), the drafter (EAGLE-3 or DFlash), and, for
EAGLE-3, the same drafter fed its aux states in the wrong order (a control that must collapse
toward τ = 1).

With ``eval.engine: vllm`` (or ``--engine vllm``) the export is also served by vLLM itself, once
eyas has released the target, and its own counters stand beside eyas's figures, checked for
agreement (:mod:`eyas.eval.vllm_engine`).
With ``eval.in_process: false`` as well, the target is never loaded here (it may not fit one
device): vLLM runs plain decoding and the drafter, and its figures are the report.

Guarantees: with temperature 0 every method's output is checked against plain greedy
decoding on every prompt, and any difference is reported as a failure. Per-prompt results
are appended to ``eval/results-<settings hash>.jsonl`` as they finish, keyed by the settings,
the target, the drafter's content and each prompt's tokens, so an interrupted eval resumes and
a changed setting, drafter or prompt never reuses stale results. An evaluation with
command-line overrides (other prompts, drafter or engine) writes ``eval/<name>/``, never the
run's own report.
"""

from __future__ import annotations

import gc
import json
import logging
import platform
import re
import time
from dataclasses import asdict
from pathlib import Path

import torch

from eyas.config import ConfigError, RunConfig
from eyas.console import console, progress
from eyas.eval.drafter import load_drafter
from eyas.eval.plot import plot_acceptance
from eyas.eval.prompts import EvalPrompt, load_eval_prompts
from eyas.eval.report import (
    PLAIN,
    PromptResult,
    engine_check_line,
    engine_failures,
    llamacpp_table,
    lossless_failures,
    plain_summary,
    report_frame,
    summarize,
    table,
    write_report,
)
from eyas.files import write_json_atomic
from eyas.jsonl import DurableAppender, read_jsonl, recover
from eyas.paths import RunPaths
from eyas.records import content_hash
from eyas.speculate.decode import TargetRunner, greedy_decode, speculative_decode
from eyas.speculate.drafter import DrafterProposer, broken_control
from eyas.speculate.lookup import PromptLookup
from eyas.stage import StageContract, StageError, StageRun, begin, file_digest, flat
from eyas.target import resolved_here

log = logging.getLogger(__name__)

__all__ = ["run", "default_draft_dir", "with_overrides", "engine_failures", "lossless_failures"]

RESULT_INDEPENDENT_KEYS = {
    "max_prompts",
    "engine",
    "in_process",
    "tensor_parallel_size",
    "llamacpp_repeats",
    "prompts (content)",
}
"""Eval settings that do not change one prompt's own results, so the per-prompt cache outlives
them: which prompts are taken (each cached result carries its own prompt's digest), and who
else runs the export besides eyas."""


def draft_dir(config: RunConfig) -> Path:
    """The drafter evaluated: ``eval.draft``, else the run's export in the layout the engine serves."""
    if config.eval.draft is not None:
        return Path(config.eval.draft)
    return default_draft_dir(RunPaths.of(config), config.eval.engine)


def fingerprint(config: RunConfig) -> dict:
    """Every eval key, the target as it runs, the drafter's content and the prompts' content (a
    prompt file's bytes; the held-out split comes with merge's marker)."""
    from eyas.drafter.layout import content_digest
    from eyas.target import served_identity

    keys = flat("eval", config.eval.model_dump(mode="json", exclude={"prompts", "draft"}))
    keys |= served_identity(config.target)
    keys["drafter (content)"] = content_digest(draft_dir(config))
    if config.eval.prompts is not None:
        prompts = Path(config.eval.prompts)
        keys["eval.prompts (content)"] = file_digest(prompts) if prompts.is_file() else None
    return keys


def inputs(config: RunConfig) -> list[str]:
    return (["merge"] if config.eval.prompts is None else []) + (["export"] if config.eval.draft is None else [])


CONTRACT = StageContract(
    "eval", inputs, fingerprint, lambda c, p: [p.eval_report], resumes_itself=True, resolved=resolved_here
)


def default_draft_dir(paths: RunPaths, engine: str = "eyas") -> Path:
    """Where ``eyas export`` puts the drafter the engine serves: the SGLang layout, or vLLM's."""
    return paths.export("vllm" if engine == "vllm" else "sglang")


def with_overrides(
    config: RunConfig, prompts: str | None = None, draft: str | None = None, engine: str | None = None
) -> tuple[RunConfig, str | None]:
    """The config an ``eyas eval`` with command-line overrides evaluates, and the name its report
    goes under (``eval/<name>/``), or None when nothing differs from the run's own eval: a report
    on other prompts, another drafter or another engine never replaces the run's."""
    changes, names = {}, []
    if prompts is not None and str(Path(prompts).resolve()) != config.eval.prompts:
        changes["prompts"] = str(Path(prompts).resolve())
        names.append(Path(prompts).stem)
    if draft is not None and Path(draft).resolve() != draft_dir(config).resolve():
        changes["draft"] = str(Path(draft).resolve())
        names.append(f"draft-{Path(draft).resolve().name}")
    if engine is not None and engine != config.eval.engine:
        changes["engine"] = engine
        names.append(engine)
    if not changes:
        return config, None
    name = re.sub(r"[^A-Za-z0-9_.+-]", "_", "+".join(names))
    return config.model_copy(update={"eval": config.eval.model_copy(update=changes)}), name


def eval_paths(config: RunConfig, name: str | None) -> RunPaths:
    """The run's layout with the eval directory where this evaluation's report goes."""
    paths = RunPaths.of(config)
    return paths if name is None else paths.moving("eval", paths.eval_dir / name)


def run(config: RunConfig, quiet: bool = False, name: str | None = None) -> dict:
    """Evaluate and return the report (also written to ``eval/report.json``, or
    ``eval/<name>/report.json`` for an evaluation with overrides, see :func:`with_overrides`)."""
    from eyas.drafter.families import family_at, options_set
    from eyas.target import load_tokenizer, stop_token_ids

    paths = eval_paths(config, name)
    cfg = config.eval
    if cfg.engine != "vllm" and not cfg.in_process:
        raise ConfigError(
            "--engine eyas: eval.in_process is false, so only vLLM runs the target; set it to true or drop --engine"
        )
    drafter_dir = draft_dir(config)
    require_drafter(config, drafter_dir)
    if cfg.engine == "llamacpp":
        from eyas.target.llamacpp_support import require_served

        require_served(config.target, family_at(drafter_dir), options_set(drafter_dir))
    if cfg.engine == "vllm":
        _require_vllm_runs(family_at(drafter_dir))
    started = begin(config, CONTRACT, paths)
    paths.marker("eval").unlink(missing_ok=True)
    tokenizer = load_tokenizer(config.target)
    eval_prompts = load_eval_prompts(config, tokenizer)
    stop_ids = stop_token_ids(tokenizer)
    steps = draft_length(config, drafter_dir)
    if not cfg.in_process:
        from eyas.eval.vllm_engine import run_in_vllm_only

        report = run_in_vllm_only(config, drafter_dir, eval_prompts, stop_ids, paths.eval_dir, steps)
        return _finish(report, paths, started, quiet, keep=None)
    report, done, dtype, results_path = _eval_in_process(
        config, started, drafter_dir, eval_prompts, stop_ids, paths, quiet
    )
    if cfg.engine == "vllm":
        # The target and drafter went with _eval_in_process; vLLM's start-up wants their device memory
        # back, which the caching allocator keeps until asked (and cycles keep until collected).
        gc.collect()
        torch.cuda.empty_cache()
        _add_vllm(report, config, dtype, drafter_dir, eval_prompts, stop_ids, paths, done, steps)
    elif cfg.engine == "llamacpp":
        report["llamacpp"] = _in_llamacpp(config, drafter_dir, eval_prompts, paths, steps)
    return _finish(report, paths, started, quiet, keep=results_path)


def draft_length(config: RunConfig, drafter_dir: Path) -> int:
    """``eval.num_draft_tokens`` as the drafter drafts them in one pass (a DFlash drafter at most
    its block size − 1, :meth:`~eyas.drafter.spec.DrafterSpec.draft_length`): what llama.cpp and
    vLLM are asked for, so no engine row is a longer draft in name only."""
    return drafter_spec(config, drafter_dir).draft_length(config.eval.num_draft_tokens)


def drafter_spec(config: RunConfig, drafter_dir: Path):
    from eyas.drafter.families import read_spec
    from eyas.target import load_model_config, text_config

    layers = text_config(load_model_config(config.target)).num_hidden_layers
    return read_spec(drafter_dir, layers)


def _require_vllm_runs(family) -> None:
    """Refuse, before starting vLLM, a family only its GPU model runner drafts with, on a machine
    without a GPU (vLLM's CPU build would refuse it after loading the target)."""
    import torch

    if family.vllm_gpu_only and not torch.cuda.is_available():
        raise ConfigError(
            f"--engine vllm: vLLM runs {family.title} drafters ({family.vllm_method}) in its GPU model runner "
            "only, and this machine has no GPU; measure it in llama.cpp instead (`eyas eval CONFIG --engine llamacpp`)"
        )


def require_drafter(config: RunConfig, drafter_dir: Path) -> None:
    """Refuse, before loading anything, a drafter directory that holds none, naming the command
    that writes it: the run's own export holds only the layouts its config serves, so another
    engine's layout (``--engine vllm`` reads ``export/vllm``) is one ``--format`` away."""
    if (drafter_dir / "config.json").is_file():
        return
    if config.eval.draft is not None:
        raise StageError(f"eval: {drafter_dir} holds no drafter (no config.json); pass --draft DIR naming one")
    layout = "vllm" if config.eval.engine == "vllm" else "sglang"
    raise StageError(
        f"eval: {drafter_dir} holds no drafter yet; run `eyas export CONFIG --format {layout}`, which writes it "
        "(or pass --draft DIR)"
    )


def _in_llamacpp(config: RunConfig, drafter_dir: Path, prompts: list[EvalPrompt], paths: RunPaths, steps: int) -> dict:
    """The drafter eyas evaluated, in ``llama-server``, drafting 1 … ``steps`` tokens: the GGUF files
    ``eyas export --format gguf`` writes and its README serves — the conversions of
    :mod:`eyas.target.llamacpp`, cached by content: the target in the precision its checkpoint
    declares (not the one eyas computes in here: f32 on a CPU), the drafter in
    ``export.gguf_type``."""
    from eyas.eval.llamacpp_engine import measure, server_threads

    llamacpp, ggufs, draft = served_ggufs(config, drafter_dir)
    # Measured once per drafter, target, prompts and settings, and only ever read back by the
    # build, thread count and machine that measured it (the section says which): timings of
    # another are not these.
    cfg = config.eval
    configs = llamacpp_configurations(config, drafter_dir, draft, steps)
    measured_by = {"llama-server": llamacpp.build_identity(), "threads": server_threads(), "host": platform.node()}
    request = {
        "draft": draft.name,
        "target": ggufs.same_precision.name,
        "prompts": [_prompt_digest(p) for p in prompts],
        "settings": [list(configs), cfg.max_new_tokens, cfg.llamacpp_repeats, cfg.llamacpp_tie_margin],
        "measured_by": measured_by,
        # Sections measured before every round's outputs were checked (only the last round's) are not reused.
        "lossless": "every round",
    }
    cached = paths.eval_dir / f"llamacpp-{content_hash(request)}.json"
    if not cached.is_file():
        section = measure(config, llamacpp, ggufs.same_precision, configs, prompts, paths.eval_dir)
        write_json_atomic(cached, {**section, "draft": str(draft), "measured_by": measured_by})
    return {**json.loads(cached.read_text()), "result_file": cached.name}


def served_ggufs(config: RunConfig, drafter_dir: Path):
    """The llama.cpp build, the target's GGUF files (:func:`served_target_ggufs`) and the
    drafter's, converted from ``drafter_dir`` (cached by content) in ``export.gguf_type`` — the
    file ``eyas export --format gguf`` writes — or, without it, the target's precision."""
    from eyas.target.llamacpp import draft_gguf

    llamacpp, ggufs = served_target_ggufs(config)
    return llamacpp, ggufs, draft_gguf(llamacpp, drafter_dir, ggufs, config.export.gguf_type)


def served_target_ggufs(config: RunConfig):
    """The llama.cpp build and the target's GGUF files, converted in the precision its checkpoint
    declares."""
    from eyas.drafter.layout import dtype_name, target_dtype
    from eyas.target import load_model_config
    from eyas.target.llamacpp import GGUF_TYPES, find_llamacpp, target_ggufs

    llamacpp = find_llamacpp(config.target.llamacpp)
    outtype = GGUF_TYPES[dtype_name(target_dtype(load_model_config(config.target)))]
    return llamacpp, target_ggufs(config.target, llamacpp, outtype)


def llamacpp_configurations(config: RunConfig, drafter_dir: Path, draft: Path, steps: int) -> dict[str, list[str]]:
    """The ``llama-server`` configurations eval measures the drafter at (``draft``: its GGUF):
    plain, n-grams, and draft lengths 1 … ``steps`` at each ``eval.llamacpp_p_min`` the family
    serves (:func:`eyas.eval.llamacpp_engine.configurations`)."""
    from eyas.drafter.families import family_at
    from eyas.eval.llamacpp_engine import configurations

    family = family_at(drafter_dir)
    p_mins = family.llamacpp_p_mins(drafter_spec(config, drafter_dir), config.eval.llamacpp_p_min)
    return configurations(draft, steps, family, p_mins)


def _eval_in_process(
    config: RunConfig, started: StageRun, drafter_dir: Path, eval_prompts: list[EvalPrompt], stop_ids, paths, quiet
) -> tuple[dict, dict, str, Path]:
    """eyas's own eval with the target loaded here: the report, the per-prompt results, the
    target's dtype and the results file. Everything it loads is released when it returns, so
    vLLM can have the device next."""
    from eyas.target import load_model

    cfg = config.eval
    model = load_model(config.target)
    drafter = load_drafter(drafter_dir, model)
    sample_drafts = cfg.draft_sampling == "sample"
    proposers = [PromptLookup(cfg.lookup_max_ngram), DrafterProposer(drafter, sample_drafts=sample_drafts)]
    control = broken_control(drafter, sample_drafts) if cfg.broken_control else None
    if control is not None:
        proposers.append(control)

    fingerprint_now = started.marker["fingerprint"]
    results_key = {k: v for k, v in fingerprint_now.items() if k.removeprefix("eval.") not in RESULT_INDEPENDENT_KEYS}
    results_path = paths.eval_dir / f"results-{content_hash(results_key)}.jsonl"
    done = _load_done(results_path, {p.id: _prompt_digest(p) for p in eval_prompts})
    methods = [PLAIN] + [p.name for p in proposers]
    todo = sum(1 for p in eval_prompts for m in methods if (m, p.id) not in done)
    if todo:
        # The first forward passes of a process pay one-off allocation and kernel set-up
        # (~10 s on CPU); untimed here so they do not land on the first prompt's figures.
        with TargetRunner(model) as runner:
            greedy_decode(runner, eval_prompts[0].input_ids, 4, stop_ids)
    started_at, tokens = time.monotonic(), 0
    with DurableAppender(results_path) as out, progress(quiet) as bar:
        task = bar.add_task("eval", total=todo, rate=0.0)
        for index, prompt in enumerate(eval_prompts):
            for method in methods:
                if (method, prompt.id) in done:
                    continue
                result = _decode(model, prompt, method, proposers, cfg, stop_ids, index)
                done[(method, prompt.id)] = result
                out.write_json({"method": method, "prompt_digest": _prompt_digest(prompt), **asdict(result)})
                tokens += len(result.tokens)
                bar.update(task, advance=1, rate=tokens / max(time.monotonic() - started_at, 1e-9))

    report = _report(config, drafter_dir, eval_prompts, methods, done)
    return report, done, str(model.dtype).removeprefix("torch."), results_path


def _finish(report: dict, paths: RunPaths, started: StageRun, quiet: bool, keep: Path | None) -> dict:
    """Write the report, its plot and the marker; drop cached results of other settings or
    drafters, eyas's and vLLM's (they describe nothing this report shows); print the table, log
    every failed check."""
    write_report(paths.eval_report, report)
    plot_acceptance(report, paths.eval_dir / "acceptance.png")
    used = {keep.name} if keep else set()
    figures = [report["plain"], *report["methods"].values(), report.get("llamacpp", {})]
    used |= {m["result_file"] for m in figures if "result_file" in m}
    for pattern in ("results-*.jsonl", "vllm-*.json", "llamacpp-*.json"):
        for cached in paths.eval_dir.glob(pattern):
            if cached.name not in used:
                cached.unlink()
    started.finish(paths.marker("eval"))
    if not quiet:
        console.print(table(report))
        if "llamacpp" in report:
            console.print(llamacpp_table(report["llamacpp"]))
        if engine_check_line(report):
            console.print(engine_check_line(report))
    failures = lossless_failures(report)
    if failures:
        log.error("lossless check FAILED: outputs differ from plain greedy decoding: %s", failures)
    for problem in engine_failures(report):
        log.error("vLLM disagrees with eyas: %s", problem)
    return report


def _add_vllm(
    report: dict,
    config: RunConfig,
    dtype: str,
    drafter_dir: Path,
    prompts: list[EvalPrompt],
    stop_ids,
    paths,
    done,
    steps: int,
) -> None:
    """Serve the export in vLLM on the same prompts, the target in eyas's ``dtype``, drafting
    ``steps`` tokens a pass; its row and the agreement check join the report."""
    from eyas.drafter.families import family_at
    from eyas.eval import vllm_engine
    from eyas.target.settings import SpeculativeDecoding
    from eyas.target.vllm_engine import speculative_decode

    cfg = config.eval
    ids = [p.input_ids for p in prompts]
    decoding = SpeculativeDecoding.from_config(cfg, steps)
    family = family_at(drafter_dir)
    result = speculative_decode(
        config.target, decoding, drafter_dir, ids, stop_ids, dtype, paths.eval_dir, family.vllm_method
    )
    reference = {p.id: done[(PLAIN, p.id)].tokens for p in prompts} if cfg.temperature == 0 else None
    vllm = vllm_engine.summarize_vllm(result, [p.id for p in prompts], cfg.num_draft_tokens, reference)
    report["methods"][vllm_engine.method_name(family.name)] = vllm
    report["engine_check"] = vllm_engine.compare(
        report["methods"][family.name], vllm, steps, greedy=cfg.temperature == 0
    )


def _prompt_digest(prompt: EvalPrompt) -> str:
    return content_hash(prompt.input_ids)


def _load_done(path: Path, prompts: dict[str, str]) -> dict[tuple[str, str], PromptResult]:
    """Cached results of the prompts still evaluated, each only while its prompt's tokens are
    the same (``prompts``: id -> digest), so an edited prompt under an old id is decoded again."""
    if not path.exists():
        return {}
    recover(path)
    done = {}
    for _, row in read_jsonl(path):
        method, digest = row.pop("method"), row.pop("prompt_digest", None)
        if prompts.get(row["prompt_id"]) == digest:
            done[(method, row["prompt_id"])] = PromptResult(**row)
    return done


def _decode(model, prompt: EvalPrompt, name: str, proposers, cfg, stop_ids: set[int], index: int) -> PromptResult:
    if name == PLAIN:
        with TargetRunner(model) as runner:
            out = greedy_decode(runner, prompt.input_ids, cfg.max_new_tokens, stop_ids)
    else:
        proposer = next(p for p in proposers if p.name == name)
        generator = None
        if cfg.temperature > 0:
            seed = cfg.seed * 1_000_003 + index
            generator = torch.Generator().manual_seed(seed)
            # The drafter samples its proposals from torch's global generator.
            torch.manual_seed(seed)
        with TargetRunner(model, proposer.aux_layers) as runner:
            out = speculative_decode(
                runner,
                proposer,
                prompt.input_ids,
                cfg.num_draft_tokens,
                cfg.max_new_tokens,
                stop_ids,
                cfg.temperature,
                generator,
            )
    return PromptResult(prompt.id, prompt.dataset, out.tokens, out.passes, out.seconds, out.accepted_at)


def _report(config: RunConfig, drafter_dir: Path, prompts: list[EvalPrompt], methods: list[str], done) -> dict:
    cfg = config.eval
    by_method = {m: [done[(m, p.id)] for p in prompts] for m in methods}
    plain = plain_summary(by_method[PLAIN])
    reference = {r.prompt_id: r.tokens for r in by_method[PLAIN]} if cfg.temperature == 0 else None
    return report_frame(
        config,
        drafter_dir,
        prompts,
        plain,
        {
            m: summarize(by_method[m], cfg.num_draft_tokens, reference, plain["tokens_per_s"])
            for m in methods
            if m != PLAIN
        },
    )
