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
from eyas.generate.as_is import write_answers
from eyas.generate.http.errors import RunStopped
from eyas.generate.selection import reconcile
from eyas.generate.store import (
    RecordWriter,
    conversation_for,
    make_record,
    save_settings,
    scan,
    settings_changes,
)
from eyas.generate.wanted import wanted
from eyas.paths import RunPaths
from eyas.prompts.sources import source_identity
from eyas.records import PromptRecord
from eyas.stage import StageContract, StageError, begin, file_digest, flat, read_marker, spent
from eyas.target import hub_commit

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
        # The target's own revision and tokenizer make the answers of the in-house backends; set
        # only when named, so runs made before they were recorded keep matching.
        **{
            k: v
            for k, v in config.target.model_dump(include={"revision", "tokenizer"}).items()
            if v is not None and g.backend != "openai"
        },
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


def recorded_settings(config: RunConfig) -> dict:
    """What ``generate/settings.json`` holds of the records: the sampling settings and, for an
    in-house backend on a hub target, the commit its revision resolved to (:func:`hub_commit`),
    so a branch that moved between two runs stops the second instead of mixing two models'
    answers. The commit stays out of the fingerprint: records made from another one are new
    content, which makes the later stages stale by itself."""
    settings = sampling_settings(config)
    if config.generate.backend != "openai" and (commit := hub_commit(config.target)) is not None:
        settings["commit"] = commit
    return settings


RECORDED_LATER = {"commit"}
"""Settings eyas began recording after runs were made with it: a ``settings.json`` without one
was written before, and its records are taken as made with today's (which it then records)."""


def setting_key(config: RunConfig, name: str) -> str:
    """Where a sampling setting lives in the config, for messages (``generate/settings.json`` keeps
    short names so that runs made before the keys moved under ``generate.http`` still resume)."""
    if name == "model":
        return "generate.http.model" if config.generate.backend == "openai" else "target.model"
    if name in ("revision", "tokenizer"):
        return f"target.{name}"
    if name == "commit":
        return "target.revision (the commit it resolved to)"
    return f"generate.http.{name}" if name in ("reasoning", "extra_body") else f"generate.{name}"


PROMPT_KEYS = {"format", "multi_turn", "max_prompts", "output_token_target"}
"""What decides which prompts are answered, besides the source's rows (:func:`source_identity`).
A dataset's merge keys (weight, budget, drop) stay
out: they change the corpus, not the answers. Batch size, concurrency and the HTTP transport
stay out too: they change how fast answers come, not what they are."""


def fingerprint(config: RunConfig) -> dict:
    keys = {setting_key(config, k): v for k, v in sampling_settings(config).items()}
    for d in config.datasets:
        prompts = {**d.model_dump(mode="json", include=PROMPT_KEYS), **source_identity(d)}
        if not d.regenerate:  # named only when set, so runs made before the key existed stay current
            prompts["regenerate"] = False
        keys |= flat(f"datasets[{d.name}]", prompts)
    if config.generate.samples_per_prompt != 1:  # named only when set, as above
        keys["generate.samples_per_prompt"] = config.generate.samples_per_prompt
    return keys


def _observe(config: RunConfig, paths: RunPaths) -> dict:
    """The records files as they are: a record appended or lost since the marker makes generate stale."""
    return {
        f"generate/{d.name}.jsonl": file_digest(p) if (p := paths.generations(d.name)).is_file() else None
        for d in config.datasets
    }


CONTRACT = StageContract(
    "generate",
    lambda c: [],
    fingerprint,
    lambda c, p: [p.generations(d.name) for d in c.datasets],
    observe=_observe,
    resumes_itself=True,
)


def run(config: RunConfig, quiet: bool = False, redo: bool = False) -> None:
    """Generate every pending prompt; ``redo`` sets aside records made with other sampling settings.

    The marker is written when the run ends, also when it stops early for credits or budget:
    the records it describes are then what the money bought, and later stages may use them.
    """
    paths = RunPaths.of(config)
    started = begin(config, CONTRACT, paths)
    _guard_settings(config, paths, redo)
    kept = read_marker(paths.marker("generate"))  # records made otherwise took theirs aside
    if kept is not None:
        started.carry(*spent(kept))
    _require_room(config, paths)
    _reconcile(config, paths)
    for dataset in config.datasets:
        if not dataset.regenerate:
            write_answers(dataset, paths)
    try:
        if config.regenerated and config.generate.backend == "openai":
            from eyas.generate.http import run_http

            run_http(config, paths, quiet)
        elif config.regenerated:
            _run_in_house(config, paths, quiet)
    except RunStopped as e:
        _reconcile(config, paths)
        started.finish(paths.marker("generate"), config, paths, stopped=type(e).__name__)
        raise
    # Answers that completed after output_token_target was reached go aside now, not on the next run.
    _reconcile(config, paths)
    started.finish(paths.marker("generate"), config, paths)


def _require_room(config: RunConfig, paths: RunPaths) -> None:
    """Refuse to start records that will not fit (:mod:`eyas.generate.expected`: every answer
    still to write at ``generate.max_tokens``)."""
    from eyas.generate.expected import expected
    from eyas.space import Need, require_room

    need = Need("generate: records still to write", expected(config).record_bytes)
    fits = ["generate.max_tokens (shorter answers)", "datasets[NAME].max_prompts or output_token_target (fewer)"]
    require_room(paths.generate_dir, [need], fits)


def _reconcile(config: RunConfig, paths: RunPaths) -> None:
    """Each dataset's file holds exactly today's selection (:mod:`eyas.generate.selection`)."""
    settings = sampling_settings(config)
    for dataset in config.datasets:
        reconcile(dataset, paths, settings, config.generate.samples_per_prompt)


def _guard_settings(config: RunConfig, paths: RunPaths, redo: bool) -> None:
    """Refuse to add records made under other sampling settings to a dataset's file: a changed
    temperature or max_tokens would mix two distributions in one corpus. With ``redo`` the old
    records are moved aside, never deleted: they may have cost money."""
    settings_file = paths.generate_dir / "settings.json"
    settings = recorded_settings(config)
    changed = {
        k: (was, now)
        for k, (was, now) in settings_changes(settings_file, settings).items()
        if not (k in RECORDED_LATER and was is None)
    }
    if changed and not redo:
        detail = ", ".join(f"{setting_key(config, k)}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
        raise StageError(
            f"{paths.generate_dir}: records were generated with other settings ({detail}); restore them, "
            "use a new run_dir, or run `eyas generate CONFIG --redo` to move the old records aside and start over"
        )
    if changed:
        aside = paths.generate_dir / f"superseded-{time.strftime('%Y%m%d-%H%M%S')}"
        aside.mkdir()
        moved = [settings_file, paths.marker("generate")]
        for d in config.datasets:
            moved += [paths.generations(d.name), paths.generation_errors(d.name)]
        for path in moved:
            if path.exists():
                path.rename(aside / path.name)
        log.warning("records made with other settings moved to %s", aside)
    save_settings(settings_file, settings)


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

    for dataset in config.regenerated:
        state = scan(paths.generations(dataset.name))
        pending: list[PromptRecord] = [
            p for p in wanted(dataset, config.generate.samples_per_prompt) if p.record_id not in state.done
        ]
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
                jobs = [Job(p, m, generator.encode_prompt(m, p.tools), salt=p.sample) for p, m in ready]
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
