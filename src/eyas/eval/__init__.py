"""Stage 7 — eval: speculative decoding with the trained drafter, measured as a server would.

Consumes the target, the exported drafter (``--draft DIR``, default the export) and prompts
(the merge's held-out split, or ``eval.prompts`` / ``--prompts FILE`` in any stage-1 format).
Produces ``<run_dir>/eval/report.json`` (config, τ, per-position acceptance, τ per dataset,
speed with and without speculation, lossless check), ``acceptance.png`` and a printed table.

Methods, all with the same ``eval.num_draft_tokens``: plain decoding (reference output and
speed), prompt lookup (the baseline to beat), the EAGLE-3 drafter, and the same drafter fed
its aux states in the wrong order (a control that must collapse toward τ = 1).

With ``eval.engine: vllm`` (or ``--engine vllm``) the export is also served by vLLM itself, once
eyas has released the target, and its own counters stand beside eyas's figures, checked for
agreement (:mod:`eyas.eval.vllm_engine`).
With ``eval.in_process: false`` as well, the target is never loaded here (it may not fit one
device): vLLM runs plain decoding and the drafter, and its figures are the report.

Guarantees: with temperature 0 every method's output is checked against plain greedy
decoding on every prompt, and any difference is reported as a failure. Per-prompt results
are appended to ``eval/results-<settings hash>.jsonl`` as they finish, so an interrupted
eval resumes and a changed setting or drafter never reuses stale results.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import time
from dataclasses import asdict
from pathlib import Path

import torch

from eyas.config import ConfigError, RunConfig
from eyas.console import console, progress
from eyas.eval.decode import TargetRunner, greedy_decode, speculative_decode
from eyas.eval.eagle import BROKEN_ORDER, EagleProposer, load_drafter
from eyas.eval.lookup import PromptLookup
from eyas.eval.plot import plot_acceptance
from eyas.eval.prompts import EvalPrompt, load_eval_prompts
from eyas.eval.report import (
    PLAIN,
    PromptResult,
    engine_check_line,
    engine_failures,
    lossless_failures,
    plain_summary,
    report_frame,
    summarize,
    table,
    write_report,
)
from eyas.jsonl import DurableAppender, read_jsonl, recover
from eyas.paths import RunPaths
from eyas.records import content_hash
from eyas.stage import StageContract

log = logging.getLogger(__name__)

__all__ = ["run", "default_draft_dir", "engine_failures", "lossless_failures"]

CONTRACT = StageContract("eval", lambda c, p: [p.eval_report], lambda c: {"eval": c.eval.model_dump(mode="json")})
"""Eval resumes per prompt on its own (results keyed by settings and drafter); ``eyas run`` always calls it."""

ENGINE_ONLY_KEYS = {"max_prompts", "engine", "in_process", "tensor_parallel_size"}
"""Eval settings that do not change eyas's own per-prompt results (so changing them reuses them)."""


def default_draft_dir(paths: RunPaths, engine: str = "eyas") -> Path:
    """Where ``eyas export`` puts the drafter the engine serves: the SGLang layout, or vLLM's."""
    return paths.export("vllm" if engine == "vllm" else "sglang")


def run(
    config: RunConfig,
    quiet: bool = False,
    prompts: str | None = None,
    draft: Path | None = None,
    engine: str | None = None,
) -> dict:
    """Evaluate and return the report (also written to ``eval/report.json``)."""
    from eyas.target import end_of_turn_id, load_tokenizer

    paths = RunPaths.of(config)
    cfg = config.eval
    engine = engine or cfg.engine
    if engine != "vllm" and not cfg.in_process:
        raise ConfigError(
            "--engine eyas: eval.in_process is false, so only vLLM runs the target; set it to true or drop --engine"
        )
    draft_dir = Path(draft) if draft else default_draft_dir(paths, engine)
    tokenizer = load_tokenizer(config.target)
    eval_prompts = load_eval_prompts(config, tokenizer, prompts)
    stop_ids = {end_of_turn_id(tokenizer)} | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
    if not cfg.in_process:
        from eyas.eval.vllm_engine import run_in_vllm_only

        return _finish(run_in_vllm_only(config, draft_dir, eval_prompts, stop_ids, paths.eval_dir), paths, quiet)
    report, done, dtype = _eval_in_process(config, draft_dir, eval_prompts, stop_ids, prompts, paths, quiet)
    if engine == "vllm":
        # The target and drafter went with _eval_in_process; vLLM's start-up wants their device memory
        # back, which the caching allocator keeps until asked (and cycles keep until collected).
        gc.collect()
        torch.cuda.empty_cache()
        _add_vllm(report, config, dtype, draft_dir, eval_prompts, stop_ids, paths, done)
    return _finish(report, paths, quiet)


def _eval_in_process(
    config: RunConfig, draft_dir: Path, eval_prompts: list[EvalPrompt], stop_ids, prompts: str | None, paths, quiet
) -> tuple[dict, dict, str]:
    """eyas's own eval with the target loaded here: the report, the per-prompt results, the target's dtype.

    Everything it loads is released when it returns, so vLLM can have the device next.
    """
    from eyas.target import load_model

    cfg = config.eval
    model = load_model(config.target)
    drafter = load_drafter(draft_dir, model)
    sample_drafts = cfg.draft_sampling == "sample"
    proposers = [PromptLookup(cfg.lookup_max_ngram), EagleProposer(drafter, sample_drafts=sample_drafts)]
    if cfg.broken_control:
        proposers.append(EagleProposer(drafter, "eagle3_broken_aux_order", BROKEN_ORDER, sample_drafts=sample_drafts))

    settings = {
        "eval": cfg.model_dump(mode="json", exclude=ENGINE_ONLY_KEYS),
        "target": config.target.model,
        "draft": _fingerprint(draft_dir),
        "prompts": prompts or cfg.prompts,
    }
    results_path = paths.eval_dir / f"results-{content_hash(settings)}.jsonl"
    done = _load_done(results_path)
    methods = [PLAIN] + [p.name for p in proposers]
    todo = sum(1 for p in eval_prompts for m in methods if (m, p.id) not in done)
    if todo:
        # The first forward passes of a process pay one-off allocation and kernel set-up
        # (~10 s on CPU); untimed here so they do not land on the first prompt's figures.
        with TargetRunner(model) as runner:
            greedy_decode(runner, eval_prompts[0].input_ids, 4, stop_ids)
    started, tokens = time.monotonic(), 0
    with DurableAppender(results_path) as out, progress(quiet) as bar:
        task = bar.add_task("eval", total=todo, rate=0.0)
        for index, prompt in enumerate(eval_prompts):
            for name in methods:
                if (name, prompt.id) in done:
                    continue
                result = _decode(model, prompt, name, proposers, cfg, stop_ids, index)
                done[(name, prompt.id)] = result
                out.write_json({"method": name, **asdict(result)})
                tokens += len(result.tokens)
                bar.update(task, advance=1, rate=tokens / max(time.monotonic() - started, 1e-9))

    report = _report(config, draft_dir, eval_prompts, methods, done)
    return report, done, str(model.dtype).removeprefix("torch.")


def _finish(report: dict, paths: RunPaths, quiet: bool) -> dict:
    """Write the report and its plot, print the table, log every failed check."""
    write_report(paths.eval_report, report)
    plot_acceptance(report, paths.eval_dir / "acceptance.png")
    if not quiet:
        console.print(table(report))
        if engine_check_line(report):
            console.print(engine_check_line(report))
    failures = lossless_failures(report)
    if failures:
        log.error("lossless check FAILED: outputs differ from plain greedy decoding: %s", failures)
    for problem in engine_failures(report):
        log.error("vLLM disagrees with eyas: %s", problem)
    return report


def _add_vllm(
    report: dict, config: RunConfig, dtype: str, draft_dir: Path, prompts: list[EvalPrompt], stop_ids, paths, done
) -> None:
    """Serve the export in vLLM on the same prompts, the target in eyas's ``dtype``; its row and the
    agreement check join the report."""
    from eyas.eval import vllm_engine
    from eyas.target.settings import SpeculativeDecoding
    from eyas.target.vllm_engine import speculative_decode

    cfg = config.eval
    ids = [p.input_ids for p in prompts]
    decoding = SpeculativeDecoding.from_config(cfg)
    result = speculative_decode(config.target, decoding, draft_dir, ids, stop_ids, dtype, paths.eval_dir)
    reference = {p.id: done[(PLAIN, p.id)].tokens for p in prompts} if cfg.temperature == 0 else None
    vllm = vllm_engine.summarize_vllm(result, [p.id for p in prompts], cfg.num_draft_tokens, reference)
    report["methods"][vllm_engine.METHOD] = vllm
    report["engine_check"] = vllm_engine.compare(
        report["methods"]["eagle3"], vllm, cfg.num_draft_tokens, greedy=cfg.temperature == 0
    )


def _fingerprint(draft_dir: Path) -> dict:
    """The drafter's identity by content: its config and weights (not its README or path), so the
    same drafter in the SGLang and vLLM layouts shares results and a retrained one never does."""
    digests = {}
    for path in sorted(p for p in draft_dir.iterdir() if p.is_file() and p.suffix != ".md"):
        with path.open("rb") as f:
            digests[path.name] = hashlib.file_digest(f, "sha256").hexdigest()
    return digests


def _load_done(path: Path) -> dict[tuple[str, str], PromptResult]:
    if not path.exists():
        return {}
    recover(path)
    done = {}
    for _, row in read_jsonl(path):
        method = row.pop("method")
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


def _report(config: RunConfig, draft_dir: Path, prompts: list[EvalPrompt], methods: list[str], done) -> dict:
    cfg = config.eval
    by_method = {m: [done[(m, p.id)] for p in prompts] for m in methods}
    plain = plain_summary(by_method[PLAIN])
    reference = {r.prompt_id: r.tokens for r in by_method[PLAIN]} if cfg.temperature == 0 else None
    return report_frame(
        config,
        draft_dir,
        prompts,
        plain,
        {
            m: summarize(by_method[m], cfg.num_draft_tokens, reference, plain["tokens_per_s"])
            for m in methods
            if m != PLAIN
        },
    )
