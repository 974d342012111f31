"""The validation report: per dataset, how well the rebuild agrees with billing and ground truth.

Counts are accumulated chunk by chunk (:meth:`DatasetReport.add`), saved as JSON next to the
Parquet files and printed as one table.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rich.table import Table

from eyas.tokenize.rebuild import AMBIGUOUS_WHITESPACE, Dropped, Sample
from eyas.tokenize.verify import Mismatch

MAX_LISTED = 1000
"""Mismatches and drops listed one by one (all are counted)."""


@dataclass
class DatasetReport:
    dataset: str
    format: str
    samples: int = 0
    tokens: int = 0
    completion_tokens: int = 0
    billed_samples: int = 0
    billed_exact: int = 0
    billed_tokens: int = 0
    rebuilt_billed_tokens: int = 0
    prompt_checked: int = 0
    prompt_exact: int = 0
    flags: Counter = field(default_factory=Counter)
    dropped: list[dict] = field(default_factory=list)
    dropped_count: int = 0
    verified: int = 0
    verified_exact: int = 0
    verified_by_finish: dict = field(default_factory=dict)
    mismatch_causes: Counter = field(default_factory=Counter)
    mismatches: list[dict] = field(default_factory=list)

    def add(self, sample: Sample, kept: bool) -> None:
        """Count a rebuilt sample (``kept`` False: dropped for disagreeing with billing)."""
        r = sample.record
        self.flags.update(sample.flags)
        if sample.billed is not None:
            self.billed_samples += 1
            self.billed_exact += len(sample.completion_ids) == sample.billed
            self.billed_tokens += sample.billed
            self.rebuilt_billed_tokens += len(sample.completion_ids)
        if r.usage.prompt_tokens:
            self.prompt_checked += 1
            self.prompt_exact += len(sample.prompt_ids) == r.usage.prompt_tokens
        if kept:
            self.samples += 1
            self.tokens += len(sample.prompt_ids) + len(sample.completion_ids)
            self.completion_tokens += len(sample.completion_ids)
        else:
            self.drop(Dropped(r.id, f"rebuilt {len(sample.completion_ids)} completion tokens, billed {sample.billed}"))

    def drop(self, dropped: Dropped) -> None:
        self.dropped_count += 1
        if len(self.dropped) < MAX_LISTED:
            self.dropped.append({"id": dropped.id, "reason": dropped.reason})

    def verify(self, sample: Sample, mismatch: Mismatch | None) -> None:
        finish = sample.record.finish_reason
        counts = self.verified_by_finish.setdefault(finish, [0, 0])
        counts[0] += 1
        self.verified += 1
        if mismatch is None:
            counts[1] += 1
            self.verified_exact += 1
            return
        self.mismatch_causes[mismatch.cause] += 1
        if len(self.mismatches) < MAX_LISTED:
            self.mismatches.append(mismatch.to_dict())

    @property
    def deviation(self) -> float | None:
        """Aggregate |rebuilt - billed| / billed over samples with billing."""
        if not self.billed_tokens:
            return None
        return abs(self.rebuilt_billed_tokens - self.billed_tokens) / self.billed_tokens

    def to_dict(self) -> dict:
        data = {k: v for k, v in vars(self).items()}
        data["flags"] = dict(self.flags)
        data["mismatch_causes"] = dict(self.mismatch_causes)
        data["billing_exact_rate"] = self.billed_exact / self.billed_samples if self.billed_samples else None
        data["billing_deviation"] = self.deviation
        data["verify_exact_rate"] = self.verified_exact / self.verified if self.verified else None
        data["verify_exact_rate_by_finish"] = {k: c[1] / c[0] for k, c in self.verified_by_finish.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict) -> DatasetReport:
        names = cls.__dataclass_fields__
        report = cls(**{k: v for k, v in data.items() if k in names})
        report.flags, report.mismatch_causes = Counter(report.flags), Counter(report.mismatch_causes)
        return report


def _pct(num: int, den: int) -> str:
    return f"{100 * num / den:.2f}%" if den else "-"


def table(reports: list[DatasetReport]) -> Table:
    """One row per dataset: size, agreement with billing, agreement with the sampled ids."""
    t = Table(title="tokenize: rebuilt ids vs billing and ground truth")
    for col in ("dataset", "samples", "tokens", "=billing", "deviation", "ids exact", "dropped"):
        t.add_column(col, justify="left" if col == "dataset" else "right")
    for r in reports:
        dev = r.deviation
        verified = f"{_pct(r.verified_exact, r.verified)} ({r.verified})" if r.verified else "-"
        t.add_row(
            f"{r.dataset} ({r.format})",
            str(r.samples),
            str(r.tokens),
            _pct(r.billed_exact, r.billed_samples),
            f"{100 * dev:.3f}%" if dev is not None else "-",
            verified,
            str(r.dropped_count),
        )
    return t


def details(report: DatasetReport, limit: int = 20) -> list[str]:
    """Lines under the table: exact-match rate per finish reason, flags (what ambiguous whitespace
    means, since its ids are a guess), each mismatch and drop."""
    name = report.dataset
    lines = [
        f"{name}: ids exact on {finish} samples: {_pct(exact, n)} ({exact}/{n})"
        for finish, (n, exact) in sorted(report.verified_by_finish.items())
    ]
    if report.prompt_checked:
        lines.append(
            f"{name}: prompt length equals usage.prompt_tokens on {_pct(report.prompt_exact, report.prompt_checked)} "
            f"({report.prompt_exact}/{report.prompt_checked})"
        )
    if report.flags:
        lines.append(f"{name}: flags " + ", ".join(f"{k} {v}" for k, v in report.flags.most_common()))
    if report.flags[AMBIGUOUS_WHITESPACE]:
        lines.append(
            f"{name}: {AMBIGUOUS_WHITESPACE} on {report.flags[AMBIGUOUS_WHITESPACE]} samples: whitespace restored at "
            "other edges matched billing as well; the format's documented separator was kept (else the first tried)"
        )
    if report.mismatch_causes:
        lines.append(
            f"{name}: mismatch causes " + ", ".join(f"{k} {v}" for k, v in report.mismatch_causes.most_common())
        )
    for m in report.mismatches[:limit]:
        lines.append(
            f"  mismatch {m['id']} ({m['finish_reason']}) at completion token {m['position']}: "
            f"sampled {m['truth_token']!r}, rebuilt {m['rebuilt_token']!r} — {m['cause']}"
        )
    for d in report.dropped[:limit]:
        lines.append(f"  dropped {d['id']}: {d['reason']}")
    hidden = max(0, len(report.mismatches) - limit) + max(0, len(report.dropped) - limit)
    if hidden:
        lines.append(f"  … {hidden} more in report.json")
    return lines
