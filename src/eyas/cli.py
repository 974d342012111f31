"""The ``eyas`` command line: parse arguments, load the config, call the stage. Nothing else."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from eyas.config import (
    ConfigError,
    ExportConfig,
    RunConfig,
    ScalingConfig,
    TuneConfig,
    dump_config,
    load_config,
    parse_section,
)
from eyas.console import console, setup_logging
from eyas.generate.http.errors import RunStopped
from eyas.jsonl import JsonlError
from eyas.paths import RunPaths
from eyas.space import EXIT_CODE as DISK_FULL
from eyas.space import disk_full_message, is_disk_full
from eyas.stage import StageError
from eyas.target.llamacpp import LlamaCppError
from eyas.target.vllm import VllmError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Train EAGLE-3 and DFlash drafters from a target model's own outputs.",
)
config_app = typer.Typer(no_args_is_help=True, help="Inspect run configs.")
prompts_app = typer.Typer(no_args_is_help=True, help="Stage 1: prompt datasets.")
app.add_typer(config_app, name="config")
app.add_typer(prompts_app, name="prompts")

ConfigArg = Annotated[Path, typer.Argument(help="Run config (YAML).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars; warnings only.")]
RedoOpt = Annotated[
    bool,
    typer.Option(
        "--redo", help="Replace outputs made with other settings or input (kept whole until the new ones are done)."
    ),
]

EXIT_BAD_INPUT = 2


def _open_run(config_path: Path, quiet: bool = False) -> RunConfig:
    config = load_config(config_path)
    setup_logging(RunPaths.of(config).log_file, quiet)
    return config


def _ready(config: RunConfig, stage: str, config_path: Path, redo: bool = False, **kwargs) -> bool:
    """The check every stage command makes first (:func:`eyas.pipeline.prepare`); prints when there is nothing to do."""
    from eyas import pipeline

    if pipeline.prepare(config, stage, redo, str(config_path), **kwargs):
        return True
    console.print(f"{stage}: up to date, nothing to do (`eyas status {config_path}` shows every stage)")
    return False


@config_app.command("show")
def config_show(config: ConfigArg) -> None:
    """Print the resolved config with every default filled in."""
    sys.stdout.write(dump_config(load_config(config)))


@prompts_app.command("synth")
def prompts_synth(
    count: Annotated[int, typer.Option(min=1, help="Prompts to write.")],
    out: Annotated[Path, typer.Option(help="Output JSONL file (appended to and resumed).")],
    config: Annotated[Path | None, typer.Argument(help="Run config naming the target (default: embedded).")] = None,
    quiet: QuietOpt = False,
) -> None:
    """Synthesize prompts from the target itself (Magpie-style)."""
    from eyas.prompts.synth import synthesize

    if config:
        run_config = _open_run(config, quiet)
    else:
        run_config = RunConfig(run_dir=str(out.parent))
        setup_logging(None, quiet)
    synthesize(run_config, count, out, quiet)


@app.command()
def generate(
    config: ConfigArg,
    redo: Annotated[
        bool,
        typer.Option(
            "--redo", help="Records made with other sampling settings are moved aside and generation restarts."
        ),
    ] = False,
    quiet: QuietOpt = False,
) -> None:
    """Stage 2: regenerate every prompt's answer with the target."""
    from eyas import generate as stage

    run_config = _open_run(config, quiet)
    _ready(run_config, "generate", config)
    stage.run(run_config, quiet, redo)


@app.command()
def tokenize(
    config: ConfigArg,
    verify_ids: Annotated[
        bool,
        typer.Option("--verify-ids", help="Compare the rebuild with the sampled token_ids where records carry them."),
    ] = False,
    quiet: QuietOpt = False,
) -> None:
    """Stage 3: rebuild exact token ids and loss masks, checked against billing."""
    from eyas import tokenize as stage

    run_config = _open_run(config, quiet)
    _ready(run_config, "tokenize", config)
    stage.run(run_config, quiet, verify_ids=verify_ids)


@app.command()
def merge(config: ConfigArg, redo: RedoOpt = False, quiet: QuietOpt = False) -> None:
    """Stage 4: merge and shuffle every tokenized dataset; hold out the eval split."""
    from eyas import merge as stage

    run_config = _open_run(config, quiet)
    if _ready(run_config, "merge", config, redo):
        stage.run(run_config, quiet)


@app.command()
def estimate(config: ConfigArg) -> None:
    """Predict extraction storage and time from the target's config and the corpus; show what caps, fp8 and drops save."""
    from eyas.extract import estimate as stage

    stage.run(_open_run(config, quiet=True))


@app.command()
def extract(config: ConfigArg, redo: RedoOpt = False, quiet: QuietOpt = False) -> None:
    """Stage 5: target hidden states for every merged train sample (resumes; torchrun-aware)."""
    from eyas import extract as stage

    run_config = _open_run(config, quiet)
    if _ready(run_config, "extract", config, redo):
        stage.run(run_config, quiet, redo)


@app.command()
def train(
    config: ConfigArg,
    stop_after: Annotated[
        int | None, typer.Option(min=1, help="Stop after this many steps (with a checkpoint); rerun to continue.")
    ] = None,
    redo: RedoOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Stage 6: train the drafter, each family's in turn (resumes from the newest checkpoint; torchrun-aware)."""
    from eyas import train as stage

    for view in _open_run(config, quiet).drafter_views():
        if not _ready(view, "train", config, redo):
            continue
        result = stage.run(view, quiet, stop_after, redo)
        if result["eval"] is not None:
            accs = " ".join(f"{a:.3f}" for a in result["eval"]["acc"])
            console.print(
                f"eval: acc per step {accs}; simulated acceptance length {result['eval']['acceptance_length']:.3f}"
            )
        if result["final"] is not None:
            console.print(f"drafter: {result['final']}")


@app.command()
def export(
    config: ConfigArg,
    format: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="sglang, vllm, speculators or gguf: one extra layout (default: the layouts the run serves).",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Output directory (default run_dir/export/FORMAT; OUT/FAMILY for a run of several families)."
        ),
    ] = None,
    gguf_type: Annotated[
        str | None,
        typer.Option(
            "--gguf-type",
            help="f32, f16, bf16 or q8_0: the drafter's GGUF type (default export.gguf_type, else the target's).",
        ),
    ] = None,
    redo: RedoOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Write the trained drafter (each family's) in a layout SGLang, vLLM, speculators or llama.cpp serves."""
    from eyas import export as stage
    from eyas import pipeline

    own = _open_run(config, quiet)
    if gguf_type is not None:
        if format != "gguf":
            raise ConfigError("--gguf-type: the GGUF type is for --format gguf")
        export_config = parse_section(ExportConfig, {**own.export.model_dump(), "gguf_type": gguf_type}, "--gguf-type")
        own = own.model_copy(update={"export": export_config})
    views = own.drafter_views()
    for view in views:
        if format is None and out is None:
            if _ready(view, "export", config, redo):
                for written in stage.run(view, quiet):
                    console.print(f"exported to {written}")
            continue
        pipeline.require_inputs(view, "export", str(config))
        where = out / view.train.drafter if out is not None and len(views) > 1 else out
        console.print(f"exported to {stage.export_one(view, format or 'sglang', where)}")


@app.command("eval")
def eval_(
    config: ConfigArg,
    prompts: Annotated[
        Path | None, typer.Option(help="Prompt file (any stage-1 format) instead of the held-out split.")
    ] = None,
    draft: Annotated[
        Path | None,
        typer.Option(help="Drafter directory (default run_dir/export/sglang, or export/vllm with --engine vllm)."),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            help="eyas; vllm: also serve the export in vLLM and check its τ against eyas's; llamacpp: also serve it "
            "in llama-server and measure decode speed (default eval.engine)."
        ),
    ] = None,
    quiet: QuietOpt = False,
) -> None:
    """Stage 7: speculative decoding with the drafter vs prompt lookup: τ, acceptance, lossless check.

    With --prompts, --draft or --engine other than the config's, the report goes to eval/<name>/
    beside the run's own, which it never replaces. A run of several drafter families evaluates
    each, then says which decodes faster."""
    from eyas import eval as stage
    from eyas.eval.families import report_families

    if engine not in (None, "eyas", "vllm", "llamacpp"):
        raise ConfigError(f"--engine: {engine!r} is not one of eyas, vllm, llamacpp")
    own = _open_run(config, quiet)
    views = own.drafter_views()
    if draft is not None and len(views) > 1:
        raise ConfigError(
            f"--draft: {config} trains several drafter families (train.drafter: {own.train.families}); "
            "--draft evaluates one drafter, so use it with a config of one family"
        )
    reports = {}
    for view in views:
        run_config, name = stage.with_overrides(
            view, str(prompts) if prompts else None, str(draft) if draft else None, engine
        )
        _ready(run_config, "eval", config, paths=stage.eval_paths(run_config, name), run_config=view)
        reports[view.train.drafter] = stage.run(run_config, quiet, name)
    if len(views) > 1:
        report_families(own, reports, quiet, name)
    _exit_on_eval_failures(list(reports.values()))


def _exit_on_eval_failures(reports: list[dict]) -> None:
    """Exit 1 when an output differs from greedy decoding or a serving engine disagrees with eyas."""
    from eyas.eval.report import engine_failures, lossless_failures

    failed = False
    for report in reports:
        failures = lossless_failures(report)
        if failures:
            console.print(f"[bold red]lossless check failed:[/] outputs differ from greedy decoding: {failures}")
        if engine_failures(report):
            console.print("[bold red]vLLM disagrees with eyas[/] (the reasons are logged above)")
        failed |= bool(failures or engine_failures(report))
    if failed:
        raise typer.Exit(1)


@app.command()
def tune(
    config: ConfigArg,
    prompts: Annotated[
        Path | None, typer.Option(help="Prompt file (any stage-1 format) instead of the held-out split.")
    ] = None,
    draft: Annotated[Path | None, typer.Option(help="Drafter directory (default: eval's, the run's export).")] = None,
    budget_min: Annotated[
        float | None, typer.Option("--budget-min", help="Minutes of measuring at most (default tune.budget_min).")
    ] = None,
    threads: Annotated[
        str | None, typer.Option(help="llama-server thread counts to try, comma-separated (default tune.threads).")
    ] = None,
    target_gguf: Annotated[
        str | None,
        typer.Option(
            "--target-gguf",
            help="The target file to serve: `shipped` (the GGUF the target ships as) or a .gguf path "
            "(default tune.target_gguf: the target converted to its checkpoint's precision).",
        ),
    ] = None,
    quiet: QuietOpt = False,
) -> None:
    """The llama.cpp settings that decode fastest with the drafter on this machine, and whether it pays.

    Races draft length × --spec-draft-p-min × threads × the drafter's GGUF type against plain
    decoding and llama.cpp's n-gram methods on the target file, then the best setting with several
    requests in flight; writes tune/report.json, tune/speedup.png and the command into the GGUF
    export's README."""
    from eyas import tune as stage

    own = _open_run(config, quiet)
    changes = {}
    if budget_min is not None:
        changes["budget_min"] = budget_min
    if threads is not None:
        try:
            changes["threads"] = [int(t) for t in threads.split(",")]
        except ValueError:
            raise ConfigError(f"--threads: {threads!r} is not comma-separated whole numbers (e.g. 2,1)") from None
    if target_gguf is not None:
        changes["target_gguf"] = target_gguf
    tune_config = parse_section(
        TuneConfig, {**own.tune.model_dump(), **changes}, "--budget-min, --threads, --target-gguf (tune)"
    )
    views = own.drafter_views()
    if draft is not None and len(views) > 1:
        raise ConfigError(f"--draft: {config} trains several drafter families; use it with a config of one family")
    overrides = {"prompts": prompts, "draft": draft}
    eval_changes = {key: str(path.resolve()) for key, path in overrides.items() if path is not None}
    for view in views:
        eval_config = view.eval.model_copy(update=eval_changes)
        stage.run(view.model_copy(update={"tune": tune_config, "eval": eval_config}), quiet)


@app.command()
def scaling(
    config: ConfigArg,
    target_tau: Annotated[
        list[float] | None, typer.Option("--target-tau", help="τ to price (repeatable; default scaling.target_tau).")
    ] = None,
    quiet: QuietOpt = False,
) -> None:
    """Held-out τ against training samples: the gain per doubling, and the samples and price of a target τ.

    Trains the run's recipe on nested subsets of its train split (at most the full run's
    training compute in all), evaluates each like eval, fits τ against log2(samples); writes
    scaling/report.json and scaling/tau.png. A run of several drafter families gets a curve each."""
    from eyas import scaling as stage

    own = _open_run(config, quiet)
    section = own.scaling.model_dump()
    if target_tau:
        section["target_tau"] = target_tau
    scaling_config = parse_section(ScalingConfig, section, "--target-tau (scaling)")
    for view in own.drafter_views():
        stage.run(view.model_copy(update={"scaling": scaling_config}), quiet)


@app.command("run")
def run_stages(
    config: ConfigArg,
    first: Annotated[
        str | None, typer.Option("--from", help="First stage: generate, tokenize, merge, extract, train, export, eval.")
    ] = None,
    last: Annotated[str | None, typer.Option("--to", help="Last stage.")] = None,
    verify_ids: Annotated[
        bool, typer.Option("--verify-ids", help="Tokenize: compare rebuilt ids with sampled ids.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show each stage as current, stale or missing, and what would run.")
    ] = False,
    quiet: QuietOpt = False,
) -> None:
    """Run the configured stages in order: current stages are skipped, stale ones redone."""
    from eyas import pipeline

    run_config = _open_run(config, quiet or dry_run)
    if dry_run:
        console.print(pipeline.status_table(run_config, pipeline.select(first, last)))
        return
    results = pipeline.run(run_config, quiet, first, last, verify_ids, config_path=str(config))
    _exit_on_eval_failures([r["result"] for r in results.values() if r["stage"] == "eval" and r["result"]])


@app.command()
def status(config: ConfigArg) -> None:
    """Every stage as current, stale (and why) or missing; per dataset, how far generation has got."""
    from eyas import pipeline
    from eyas.generate.status import collect, table

    run_config = _open_run(config, quiet=True)
    console.print(pipeline.status_table(run_config))
    console.print(pipeline.space_line(run_config), highlight=False)
    console.print(table(collect(run_config)))


@app.command()
def providers(
    model: Annotated[str, typer.Argument(help="Model as the API names it, e.g. moonshotai/kimi-k2.5.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    config: Annotated[
        Path | None, typer.Option("--config", help="Run config whose provider policy is applied.")
    ] = None,
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="API base URL (default: the config's, else OpenRouter).")
    ] = None,
) -> None:
    """List a model's endpoints (price, quantization, speed) and which pass the provider policy."""
    from eyas.generate.http.commands import providers_command

    setup_logging(None, quiet=True)
    providers_command(model, config, base_url, as_json)


@app.command()
def plan(
    config: ConfigArg,
    apply: Annotated[
        bool, typer.Option("--apply", help="Write the proposed output_token_target values into CONFIG.")
    ] = False,
) -> None:
    """Project generation cost per dataset against generate.http.budget_usd; propose targets that fit."""
    from eyas.generate.http.commands import plan_command

    setup_logging(None, quiet=True)
    plan_command(config, apply)


@app.command()
def demo(
    run_dir: Annotated[Path, typer.Option(help="Where the demo run goes.")] = Path("runs/demo"),
    quiet: QuietOpt = False,
) -> None:
    """Run the pipeline on the embedded default, on CPU, with no network."""
    from eyas.demo import run_demo

    run_demo(run_dir, quiet)


def main() -> None:
    try:
        app()
    except (ConfigError, JsonlError) as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        sys.exit(EXIT_BAD_INPUT)
    except StageError as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        sys.exit(e.EXIT_CODE)
    except OSError as e:
        if not is_disk_full(e):
            raise
        console.print(f"[bold red]error:[/] {escape(disk_full_message(e))}", highlight=False)
        sys.exit(DISK_FULL)
    except RunStopped as e:
        # Credits exhausted (3), budget reached (4), requests rejected (5): see eyas.generate.http.errors.
        console.print(f"[bold red]stopped:[/] {escape(str(e))}", highlight=False)
        sys.exit(e.exit_code)
    except (VllmError, LlamaCppError) as e:
        console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False)
        sys.exit(1)
