"""What ``eyas scaling`` says: the gain per doubling, the samples each target τ needs and their
price, a table and ``tau.png``."""

from __future__ import annotations

import math
from pathlib import Path

from rich.table import Table

from eyas.console import console
from eyas.figures import save, subplots
from eyas.files import write_json_atomic
from eyas.paths import RunPaths
from eyas.scaling.plan import Fit


def finish(config, report: dict, fit: Fit, paths: RunPaths, quiet: bool) -> dict:
    """Add the fit and the predictions to ``report``; write it and its plot; print them."""
    from eyas.scaling import per_sample

    costs = per_sample(config)
    current = report["points"][-1]["samples"]
    report["fit"] = {
        "intercept": fit.intercept,
        "per_doubling": fit.slope,
        "per_doubling_se": fit.slope_se,
        "center": fit.center,
        "center_se": fit.center_se,
    }
    report["per_sample"] = costs
    report["predictions"] = [prediction(fit, tau, current, costs) for tau in config.scaling.target_tau]
    write_json_atomic(paths.scaling_dir / "report.json", report)
    plot(report, fit, paths.scaling_dir / "tau.png")
    if not quiet:
        console.print(table(report))
        for line in summary(report):
            console.print(line)
    return report


def prediction(fit: Fit, tau: float, current: int, costs: dict) -> dict:
    """The train samples the line puts at ``tau`` (with the slope's ± one standard error range)
    and what reaching them costs at the run's rates: generating the samples not yet had,
    and extracting and training on all of them (a new run of the same recipe)."""
    reached = fit.samples_for(tau)
    if reached is None:
        return {"tau": tau, "samples": None}
    samples, low, high = reached
    added = max(0.0, samples - current)
    price = {}
    for unit in ("seconds", "cpu_seconds", "usd"):
        parts = [
            costs.get("generate", {}).get(unit, 0.0) * added,
            *(costs.get(stage, {}).get(unit, 0.0) * samples for stage in ("extract", "train")),
        ]
        if any(unit in costs.get(stage, {}) for stage in costs):
            price[unit] = sum(parts)
    return {"tau": tau, "samples": samples, "low": low, "high": high, "added": added, "price": price}


def summary(report: dict) -> list[str]:
    fit = report["fit"]
    lines = [
        f"τ gains {fit['per_doubling']:+.3f} ± {fit['per_doubling_se']:.3f} per doubling of the train samples "
        f"({report['family']}, {len(report['points'])} points)."
    ]
    for p in report["predictions"]:
        if p["samples"] is None:
            lines.append(f"τ {p['tau']:g}: not reached by more data at this slope.")
            continue
        price = p["price"]
        cost = f"{price.get('cpu_seconds', 0.0) / 3600:,.1f} CPU-hours ({price.get('seconds', 0.0) / 3600:,.1f} h wall)"
        if "usd" in price:
            cost = f"${price['usd']:,.2f} and " + cost
        lines.append(
            f"τ {p['tau']:g}: about {p['samples']:,.0f} train samples (range {p['low']:,.0f}–{_count(p['high'])}), "
            f"{p['added']:,.0f} more than now; {cost} at this run's rates."
        )
    return lines


def _count(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:,.0f}"


def table(report: dict) -> Table:
    out = Table(title=f"held-out τ against train samples ({report['family']})")
    for column in ("samples", "share", "steps", "τ", "± se", "train CPU s"):
        out.add_column(column, justify="right")
    for p in report["points"]:
        out.add_row(
            f"{p['samples']:,}",
            f"{p['fraction']:g}",
            f"{p['steps']:,}",
            f"{p['tau']:.3f}",
            f"{p['tau_se']:.3f}",
            f"{p['train_cpu_seconds']:,.0f}",
        )
    return out


def plot(report: dict, fit: Fit, path: Path) -> Path:
    """τ against samples on a log axis, with standard errors, the fitted line and the targets."""
    fig, ax = subplots(figsize=(7, 4.2))
    points = report["points"]
    xs = [p["samples"] for p in points]
    ax.errorbar(xs, [p["tau"] for p in points], yerr=[p["tau_se"] for p in points], fmt="o", label="measured")
    reach = [p["samples"] for p in report["predictions"] if p["samples"] is not None]
    far = max([*xs, *reach]) * 1.2
    line = [min(xs) / 1.2, far]
    ax.plot(line, [fit.tau(x) for x in line], label=f"fit: {fit.slope:+.3f} per doubling")
    for p in report["predictions"]:
        ax.axhline(p["tau"], color="grey", linewidth=0.8, linestyle=":")
        if p["samples"] is not None:
            ax.plot([p["samples"]], [p["tau"]], marker="x", color="C3")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="train samples", ylabel="held-out τ", title=f"τ against data ({report['family']})")
    ax.legend(fontsize=8)
    return save(fig, path)
