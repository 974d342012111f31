"""Stage 3 — tokenize: rebuild the target's exact token ids and loss masks, and prove them.

Consumes ``<run_dir>/generate/<dataset>.jsonl`` (stage 2). Produces
``<run_dir>/tokenize/<dataset>.parquet`` with ``records.TOKENIZED_COLUMNS`` — ``input_ids``
(prompt rendered by the chat template, then the completion assembled in the model's own output
grammar with specials inserted by id) and ``loss_mask`` (1 on the completion: reasoning, think
delimiters, content, tool-call markup, end of turn) — and ``<run_dir>/tokenize/report.json``.

Guarantees: every kept sample's completion length is checked against the billed completion
tokens (``tokenize.on_mismatch`` decides what happens when they disagree); with
``verify_ids`` every record that carries the sampled ``token_ids`` is compared id for id and each
mismatch is explained. A dataset's Parquet file appears only once complete; a rerun redoes
exactly the datasets whose records (by content) or settings changed, so the stage always runs
and is never refused; its marker says which records it consumed.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from eyas.config import RunConfig
from eyas.console import console, progress
from eyas.files import write_json_atomic
from eyas.generate.store import read_records
from eyas.jsonl import read_jsonl
from eyas.paths import RunPaths
from eyas.stage import StageContract, begin, file_digest, flat, target_identity
from eyas.tokenize.formats import Format
from eyas.tokenize.report import DatasetReport, details, table

log = logging.getLogger(__name__)

CHUNK_RECORDS = 4096
"""Records per batch-encode call: large enough to keep the Rust tokenizer busy, small in memory."""


def run(config: RunConfig, quiet: bool = False, verify_ids: bool = False) -> dict:
    """Rebuild every dataset's records; returns the report that is also written to report.json."""
    from eyas.tokenize.load import load_format

    paths = RunPaths.of(config)
    started = begin(config, CONTRACT, paths)
    fmt = load_format(config)
    reports = []
    for dataset in config.datasets:
        source = paths.generations(dataset.name)
        if not source.exists():
            log.warning("%s: no generation records at %s; run `eyas generate` first", dataset.name, source)
            continue
        key = _dataset_key(config, source)
        done = _load_done(paths, dataset.name, key, verify_ids)
        if done is not None:
            log.info("%s: already tokenized with these records and settings", dataset.name)
            reports.append(done)
            continue
        # From the first dataset redone until the last is written, no marker vouches for the directory.
        paths.marker("tokenize").unlink(missing_ok=True)
        report = _tokenize_dataset(config, fmt, source, paths.tokenized(dataset.name), verify_ids, quiet)
        _save_done(paths, dataset.name, key, report, verify_ids)
        reports.append(report)
    verified = verify_ids or any(r.verified for r in reports)
    result = {"format": fmt.name, "verify_ids": verified, "datasets": {r.dataset: r.to_dict() for r in reports}}
    write_json_atomic(paths.tokenize_report, result, ensure_ascii=False)
    started.finish(paths.marker("tokenize"))
    if not quiet and reports:
        console.print(table(reports))
        for r in reports:
            for line in details(r):
                console.print(line, markup=False, highlight=False)
    return result


def _tokenize_dataset(
    config: RunConfig, fmt: Format, source: Path, out_path: Path, verify_ids: bool, quiet: bool
) -> DatasetReport:
    from eyas.tokenize.parquet import ParquetOut, table_of
    from eyas.tokenize.rebuild import Rebuilder
    from eyas.tokenize.verify import compare

    name = out_path.stem
    report = DatasetReport(name, fmt.name)
    rebuilder = Rebuilder(fmt, stop_strings=bool(config.generate.stop))
    policy = config.tokenize.on_mismatch
    total = sum(1 for _ in read_jsonl(source))
    out = ParquetOut(out_path)
    started = time.monotonic()
    try:
        with progress(quiet) as bar:
            task = bar.add_task(name, total=total, rate=0.0)
            for chunk in _chunks(read_records(source), CHUNK_RECORDS):
                samples, dropped = rebuilder.rebuild(chunk)
                for d in dropped:
                    report.drop(d)
                kept = []
                for s in samples:
                    off = "billing-mismatch" in s.flags
                    if policy == "keep" and off:
                        s.flags.remove("billing-mismatch")
                    keep = not (off and policy == "drop")
                    report.add(s, keep)
                    if keep:
                        kept.append(s)
                    if verify_ids and s.record.token_ids is not None:
                        report.verify(s, compare(s, fmt.encoder))
                out.write(table_of(kept, fmt.name))
                rate = report.tokens / max(time.monotonic() - started, 1e-9)
                bar.update(task, advance=len(chunk), rate=rate)
        out.commit()
    except BaseException:
        out.abort()
        raise
    return report


def _chunks(items, size: int):
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def fingerprint(config: RunConfig) -> dict:
    """The settings a dataset's ids depend on: the grammar, stop strings, the target's tokenizer.
    Not ``--verify-ids``: it adds checks to the report and leaves the ids as they are."""
    return {
        **flat("tokenize", config.tokenize.model_dump(mode="json")),
        "generate.stop": config.generate.stop,
        **target_identity(config.target),
    }


CONTRACT = StageContract(
    "tokenize",
    lambda c: ["generate"],
    fingerprint,
    lambda c, p: [p.tokenize_report] + [p.tokenized(d.name) for d in c.datasets if not d.drop],
    resumes_itself=True,
)


def _dataset_key(config: RunConfig, source: Path) -> dict:
    """What a dataset's output depends on: the records by content, and the stage's fingerprint."""
    return {"records": file_digest(source), **fingerprint(config)}


def _load_done(paths: RunPaths, dataset: str, key: dict, verify_ids: bool) -> DatasetReport | None:
    """The report of a dataset already tokenized under ``key``; one verified earlier also serves a
    run that does not ask to verify (the ids are the same), not the other way round."""
    marker = paths.tokenize_done(dataset)
    if not marker.exists() or not paths.tokenized(dataset).exists():
        return None
    saved = json.loads(marker.read_text())
    if saved.get("key") != key or (verify_ids and not saved.get("verified")):
        return None
    return DatasetReport.from_dict(saved["report"])


def _save_done(paths: RunPaths, dataset: str, key: dict, report: DatasetReport, verified: bool) -> None:
    """Written after the Parquet file is in place: its existence means the dataset is complete."""
    done = {"key": key, "verified": verified, "report": report.to_dict()}
    write_json_atomic(paths.tokenize_done(dataset), done, ensure_ascii=False)
