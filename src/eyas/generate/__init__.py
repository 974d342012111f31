"""Stage 2 — generate: regenerate every prompt's answer with the target.

Consumes the configured datasets (stage 1); produces ``<run_dir>/generate/<dataset>.jsonl``
with one :class:`~eyas.records.GenerationRecord` per prompt, written by one writer
(:mod:`eyas.generate.store`) whatever the backend. Reruns skip finished prompts; a killed
run resumes with exactly one record per prompt.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from eyas.config import RunConfig
from eyas.console import progress
from eyas.generate.store import RecordWriter, conversation_for, make_record, scan, settings_guard
from eyas.paths import RunPaths
from eyas.prompts import iter_prompts
from eyas.records import PromptRecord
from eyas.stage import StageContract

if TYPE_CHECKING:
    from eyas.target.generation import BatchGenerator

log = logging.getLogger(__name__)


def sampling_settings(config: RunConfig) -> dict:
    """The settings that shape the output distribution; records made under others are not mixed in."""
    g = config.generate
    model = g.http.model if g.backend == "openai" else config.target.model
    settings = {
        "backend": g.backend,
        "model": model,
        "max_tokens": g.max_tokens,
        "temperature": g.temperature,
        "top_p": g.top_p,
        "seed": g.seed,
        "stop": g.stop,
    }
    # Optional request shapers are recorded only when set, so runs that never used them keep matching.
    if g.http.reasoning:
        settings["reasoning"] = g.http.reasoning.model_dump(exclude_none=True)
    if g.http.extra_body:
        settings["extra_body"] = g.http.extra_body
    return settings


CONTRACT = StageContract(
    "generate",
    lambda c, p: [p.generations(d.name) for d in c.datasets],
    lambda c: {"sampling": sampling_settings(c), "datasets": [d.model_dump(mode="json") for d in c.datasets]},
)


def run(config: RunConfig, quiet: bool = False) -> None:
    paths = RunPaths.of(config)
    settings_guard(paths.generate_dir / "settings.json", sampling_settings(config))
    if config.generate.backend == "openai":
        from eyas.generate.http import run_http

        run_http(config, paths, quiet)
    else:
        _run_in_house(config, paths, quiet)


def _run_in_house(config: RunConfig, paths: RunPaths, quiet: bool) -> None:
    """The local and vLLM backends: length-sorted batches of the target's own sampled ids."""
    from eyas.target import load_tokenizer
    from eyas.target.engines import open_generator
    from eyas.target.settings import Sampling

    engine = "vllm" if config.generate.backend == "vllm" else "transformers"
    sampling = Sampling.from_config(config.generate)
    log_path = paths.generate_dir / "vllm.log"
    with open_generator(config.target, sampling, engine, load_tokenizer(config.target), log_path) as generator:
        _generate_datasets(config, paths, quiet, generator)


def _generate_datasets(config: RunConfig, paths: RunPaths, quiet: bool, generator: BatchGenerator) -> None:
    from eyas.target.generation import Job, run_jobs, usage_of

    for dataset in config.datasets:
        state = scan(paths.generations(dataset.name))
        pending: list[PromptRecord] = [p for p in iter_prompts(dataset) if p.record_id not in state.done]
        if not pending:
            log.info("%s: all prompts already generated", dataset.name)
            continue
        target = dataset.output_token_target
        started, tokens = time.monotonic(), 0
        with RecordWriter(paths.generations(dataset.name), state) as writer, progress(quiet) as bar:
            task = bar.add_task(dataset.name, total=len(pending), rate=0.0)

            def on_done(job: Job, completion) -> None:
                nonlocal tokens
                prompt: PromptRecord = job.key
                writer.write(
                    make_record(
                        prompt,
                        job.messages,
                        content=completion.text,
                        finish_reason=completion.finish_reason,
                        model=config.target.model,
                        provider=config.generate.backend,
                        usage=usage_of(completion),
                        token_ids=completion.token_ids,
                    )
                )
                tokens += len(completion.token_ids)
                bar.update(task, advance=1, rate=tokens / max(time.monotonic() - started, 1e-9))

            # Multi-turn conversations go in rounds: turn k waits for the model's answer to turn k-1.
            while pending:
                ready, waiting = [], []
                for p in pending:
                    messages = conversation_for(p, state)
                    (ready if messages is not None else waiting).append((p, messages))
                if not ready:
                    log.warning(
                        "%s: %d turns wait for earlier turns that could not be generated", dataset.name, len(waiting)
                    )
                    break
                jobs = [Job(p, m, generator.encode_prompt(m, p.tools)) for p, m in ready]
                run_jobs(
                    generator,
                    jobs,
                    on_done,
                    seed=config.generate.seed,
                    should_stop=lambda: target is not None and state.completion_tokens >= target,
                )
                pending = [p for p, _ in waiting if p.record_id not in state.done]
                if target is not None and state.completion_tokens >= target:
                    log.info("%s: output_token_target %d reached", dataset.name, target)
                    break
        log.info("%s: %d records, %d completion tokens", dataset.name, len(state.done), state.completion_tokens)
