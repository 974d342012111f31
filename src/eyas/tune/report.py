"""What ``eyas tune`` says: the verdict and the command, the table, ``speedup.png``, and the
"Tuned on this machine" section of the GGUF export's README."""

from __future__ import annotations

import shutil
from pathlib import Path

from rich.table import Table

from eyas.console import console
from eyas.eval.llamacpp_engine import drafting
from eyas.figures import save, subplots
from eyas.files import write_json_atomic
from eyas.paths import RunPaths
from eyas.tune.plan import DRAFT, PLAIN, Cell

README_SECTION = "## Tuned on this machine"


def finish(config, report: dict, paths: RunPaths, llamacpp, quiet: bool) -> dict:
    """Add the verdict and the command to ``report``; write it, its plot and the README section."""
    own_export = config.eval.draft is None and (paths.export("gguf") / "README.md").is_file()
    report["verdict"] = verdict(report)
    report["command"] = None
    if serves(report):
        gguf = Cell.from_key(report["best"]).gguf
        draft = served_draft(paths, report, gguf) if own_export else Path(report["drafts"][gguf])
        report["command"] = command(report, llamacpp.server, draft)
    write_json_atomic(paths.tune_dir / "report.json", report)
    plot(report, paths.tune_dir / "speedup.png")
    if own_export:
        write_readme_section(paths.export("gguf") / "README.md", report)
    if not quiet:
        console.print(table(report))
        console.print(report["verdict"])
        if report["command"]:
            console.print(report["command"], soft_wrap=True)
    return report


def served_draft(paths: RunPaths, report: dict, gguf: str) -> Path:
    """The run's GGUF export of the drafter in type ``gguf``: ``draft.gguf`` when that is the
    export's type, else a copy of the tuned file beside it, ``draft-<type>.gguf``, so the command
    names a file of the export that outlives eyas's cache (copied on every tune: the drafter
    tuned is the one the copy holds)."""
    if gguf == report["export_type"]:
        return paths.export_gguf
    copy = paths.export("gguf") / f"draft-{gguf}.gguf"
    tmp = copy.with_name(copy.name + ".tmp")
    shutil.copyfile(report["drafts"][gguf], tmp)
    tmp.replace(copy)
    return copy


def describe(key: str) -> str:
    """A cell in words: ``draft length 2, p-min 0.5, f16 drafter, 2 threads`` (``, 4 in flight``)."""
    cell = Cell.from_key(key)
    what = {PLAIN: "plain decoding", DRAFT: f"draft length {cell.n}, p-min {cell.p_min:g}, {cell.gguf} drafter"}.get(
        cell.method, cell.method
    )
    load = f", {cell.in_flight} in flight" if cell.in_flight > 1 else ""
    return f"{what}, {cell.threads} thread{'s' if cell.threads > 1 else ''}{load}"


def serves(report: dict) -> bool:
    """Whether the drafter's best setting decodes faster than every way to serve without it,
    beyond the measurement's noise: its interval clear of the fastest draftless method's (a
    lead of point estimates alone is no reason to serve a drafter)."""
    best = report["best"]
    cells = report["cells"]
    return best is not None and cells[best]["low"] > cells[report["baseline"]]["high"]


def verdict(report: dict) -> str:
    return _verdict(report) + _batching_note(report)


def _batching_note(report: dict) -> str:
    """What plain decoding itself did with requests in flight, where it departed from decoding
    one request at a time (see :class:`eyas.tune.Lossless`)."""
    departures = report.get("batched_departures") or {}
    if not departures:
        return ""
    loads = " and ".join(departures)
    prompts = sorted({p for ids in departures.values() for p in ids})
    return (
        f" With {loads} requests in flight, plain decoding itself departs from one-at-a-time decoding on "
        f"{len(prompts)} of {report['prompts']} prompts ({', '.join(prompts)}): llama.cpp's batched kernels round "
        "otherwise on this target file, drafter or not, so a setting at that load is held to plain decoding at "
        "the same load."
    )


def _verdict(report: dict) -> str:
    cells, best, baseline = report["cells"], report["best"], report["baseline"]
    if best is None:
        return "No drafter setting kept plain decoding's outputs: do not serve this drafter (see the lossless column)."
    b, o = cells[best], cells[baseline]
    if b["speedup"] <= o["speedup"]:
        return (
            f"Do not serve this drafter on this machine: {describe(baseline)} decodes at {o['speedup']:.2f}× plain, "
            f"the drafter's best ({describe(best)}) at {b['speedup']:.2f}×." + _budget_note(report)
        )
    if not serves(report):
        return (
            f"No gain measured on this machine: the drafter's best ({describe(best)}, {_figure(b)}) is within the "
            f"measurement's noise of {describe(baseline)} ({_figure(o)}); serve that, or measure more rounds "
            "(tune.max_rounds, a larger --budget-min) to tell them apart." + _budget_note(report)
        )
    text = f"Serve it with {describe(best)}: {_figure(b)} plain decoding, clear of {describe(baseline)} ({_figure(o)})."
    crossover = report["crossover"]
    if crossover is not None:
        text += f" With {crossover} or more requests in flight it is slower than plain decoding."
    return text + _budget_note(report)


def _figure(cell: dict) -> str:
    """A cell's speed-up with its interval: ``1.15× [1.13, 1.17]``."""
    return f"{cell['speedup']:.2f}× [{cell['low']:.2f}, {cell['high']:.2f}]"


def _budget_note(report: dict) -> str:
    """What was left unmeasured when the budget ran out, and how to continue."""
    budget = report["budget"]
    if not budget["exhausted"]:
        return ""
    last = report["phases"][-1]["name"]
    return (
        f" The {budget['minutes']:g}-minute budget ran out in the {last} phase; a larger --budget-min "
        "continues from the rounds already measured."
    )


def command(report: dict, server: Path, draft: Path) -> str:
    """The ``llama-server`` command line of the best setting."""
    cell = Cell.from_key(report["best"])
    spec = " ".join(drafting(draft, report["spec_type"], cell.n, cell.p_min))
    return f"{server} -m {report['target']} -t {cell.threads} {spec}"


def write_readme_section(readme: Path, report: dict) -> None:
    """Replace (or append) the README's tuned section, always its last."""
    text = readme.read_text()
    text = text.split(README_SECTION)[0].rstrip("\n") + "\n\n"
    by = report["measured_by"]
    section = (
        f"{README_SECTION}\n\n`eyas tune` on {by['host']} ({by['cpus']} cores), {report['prompts']} prompts, "
        f"{report['max_new_tokens']} tokens each. {report['verdict']}\n"
    )
    if report["command"]:
        section += f"\n```bash\n{report['command']}\n```\n"
    readme.write_text(text + section)


def table(report: dict) -> Table:
    out = Table(title=f"llama.cpp on this machine: speed-up over plain decoding ({report['prompts']} prompts)")
    for column in ("setting", "tok/s", "speed-up", "interval", "τ", "lossless"):
        out.add_column(column, justify="left" if column == "setting" else "right")
    rows = sorted(report["cells"].items(), key=lambda kv: (Cell.from_key(kv[0]).in_flight, -kv[1]["speedup"]))
    for key, c in rows:
        check = c["lossless"]
        lossless = f"{check['identical']}/{check['checked']}" + (
            f" ({len(check['float_ties'])} ties)" if check["float_ties"] else ""
        )
        if check["mismatched"]:
            lossless = f"[bold red]differs: {', '.join(check['mismatched'])}[/]"
        out.add_row(
            ("[bold]" + describe(key) + "[/]") if key == report["best"] else describe(key),
            f"{c['tokens_per_s']:.1f}",
            f"{c['speedup']:.2f}×",
            f"[{c['low']:.2f}, {c['high']:.2f}]",
            f"{c['tau']:.2f}" if c["tau"] is not None else "",
            lossless,
        )
    return out


def plot(report: dict, path: Path) -> Path:
    """Speed-up against draft length: one line per p-min and drafter GGUF type (one request in
    flight), one dashed line per in-flight count at the best setting's; plain decoding and the
    best draftless method as horizontal lines."""
    fig, ax = subplots(figsize=(7, 4.2))
    cells = {Cell.from_key(k): c for k, c in report["cells"].items()}
    best = Cell.from_key(report["best"]) if report["best"] else None
    threads = best.threads if best else min(c.threads for c in cells)
    lines: dict[tuple[int, float, str], list[tuple[int, float]]] = {}
    for cell, c in cells.items():
        if cell.drafted and cell.threads == threads:
            lines.setdefault((cell.in_flight, cell.p_min, cell.gguf), []).append((cell.n, c["speedup"]))
    types = {gguf for _, _, gguf in lines}
    for (load, p_min, gguf), points in sorted(lines.items()):
        points.sort()
        label = (
            f"p-min {p_min:g}" + (f", {gguf}" if len(types) > 1 else "") + (f", {load} in flight" if load > 1 else "")
        )
        ax.plot(*zip(*points), marker="o", linestyle="-" if load == 1 else "--", label=label)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--", label="plain decoding")
    baseline = report["baseline"]
    if not baseline.startswith(PLAIN):
        ax.axhline(
            report["cells"][baseline]["speedup"], color="C7", linewidth=0.8, linestyle=":", label=describe(baseline)
        )
    ax.set(
        xlabel="draft length",
        ylabel="speed-up over plain decoding",
        title=f"{report['family']} in llama.cpp, {threads} threads",
    )
    ax.legend(fontsize=8)
    return save(fig, path)
