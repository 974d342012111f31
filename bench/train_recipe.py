"""Which training settings buy the most held-out τ on the embedded target: one table.

Every row is a real ``eyas.train.run`` on the same merged corpus — that of a run whose merge is
done (``--run CONFIG``; ``make demo`` leaves ``runs/demo/demo.yaml``) — online with the states
cached, from the config's own ``train`` section with one group of settings changed. τ is what
training itself measures (``train.tau_*``) by speculative decoding on held-out prompts of the
merge's eval split: greedy, 3 draft tokens. The table gives the best τ (the drafter
``train/final`` keeps) and its step, the last measurement, and wall and CPU seconds of training,
so a setting that buys τ with time shows it. Rows run one after another in one process, so
their times compare; run nothing else on the machine meanwhile.

``--as-is`` adds a second table: the same drafter trained on the run's regenerated answers, on
conversations used as they are (``regenerate: false``) — the Python reference's topics from
``pydoc_data``, human-written, the only chat-shaped text every Python ships — and on both, τ
measured on the same held-out prompts. Regenerated answers cost the CPU of answering the run's
prompts again (measured by doing it); the as-is row gets that CPU time as extra training steps,
so the two compare at equal CPU time.

``--temperature T ...`` adds a table of the run's own prompts answered again at each sampling
temperature T (``generate.temperature``) and, beside them, at the run's own temperature; each
set is tokenized and trained the same way, with the base run's held-out prompts kept out of
training and τ measured on them as everywhere else: greedy, as the drafter is served here.

``--warm-start`` adds another: a drafter from scratch on the whole train split, against one
trained on half of it and warm-started (``train.init_from``) on the other half, for as many
steps in all and for fewer.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python bench/train_recipe.py --run runs/demo/demo.yaml
[--only NAME ...] [--as-is] [--temperature T ...] [--warm-start] [--tau-prompts 16]``. Each
demo-sized row takes about 6 minutes on 2 cores, and answering the demo's prompts again 3 more.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from eyas import train
from eyas.config import load_config
from eyas.paths import MARKER, RunPaths
from eyas.records import tokenized_arrow_schema
from eyas.train.metrics import read_metrics

VARIANTS: dict[str, dict] = {
    "as configured": {},
    "ttt_steps: 2": {"ttt_steps": 2},
    "ttt_steps: 5": {"ttt_steps": 5},
    "lr ÷2": {"lr_factor": 0.5},
    "lr ×2": {"lr_factor": 2.0},
    "step_weight: 1.0": {"step_weight": 1.0},
    "step_weight: 0.6": {"step_weight": 0.6},
    "draft_vocab ÷2": {"vocab_factor": 0.5},
    "draft_vocab ×2": {"vocab_factor": 2.0},
    "warmup_ratio: 0.1": {"warmup_ratio": 0.1},
    "weight_decay: 0.1": {"weight_decay": 0.1},
    "intermediate_size: 384": {"intermediate_size": 384},
    "steps ×2": {"steps_factor": 2.0},
    "aux_layers: 1, 14, 28": {"aux_layers": [1, 14, 28]},
    "EAGLE-3.1": {"eagle3": {"norm_before_fc": True, "norm_output": True}},
    "norm_before_fc alone": {"eagle3": {"norm_before_fc": True}},
}
"""Row name → changes to the config's train section (``*_factor``: relative to its value;
``aux_layers``: to ``extract.aux_layers`` instead, here the embedded target's last capturable
layer in place of its default 26)."""


def settings_for(base: dict, change: dict) -> dict:
    settings = dict(base)
    for key, value in change.items():
        if key == "lr_factor":
            settings["lr"] = base["lr"] * value
        elif key == "vocab_factor":
            settings["draft_vocab_size"] = int(base["draft_vocab_size"] * value)
        elif key == "steps_factor":
            settings["max_steps"] = int(base["max_steps"] * value)
        else:
            settings[key] = value
    return settings


def online_base(config_path: str, script: str, tau_prompts: int):
    """A finished run's config and the train section every row starts from: states cached (each
    row trains online, running the target once), τ on ``tau_prompts`` held-out prompts."""
    base_config = load_config(Path(config_path))
    if base_config.extract.mode != "online":
        raise SystemExit(f"{config_path}: bench/{script} trains online; set extract.mode: online")
    return base_config, base_config.train.model_dump() | {"cache_states": True, "tau_prompts": tau_prompts}


def variant_dir(work: Path, name: str) -> Path:
    run_dir = work / "".join(c if c.isalnum() else "_" for c in name)
    run_dir.mkdir()
    return run_dir


def link_stages(base_config, run_dir: Path, stage_dirs: tuple[str, ...]) -> None:
    for stage_dir in stage_dirs:
        os.symlink(RunPaths.of(base_config).root / stage_dir, run_dir / stage_dir)


def assemble_corpus(base_config, run_dir: Path, table: pa.Table) -> None:
    """A merge directory whose train split is ``table`` and whose eval split, stats and marker
    are the base run's, so every row is measured on the same held-out prompts."""
    base = RunPaths.of(base_config).merge_dir
    (run_dir / "merge").mkdir()
    pq.write_table(table.cast(tokenized_arrow_schema()), run_dir / "merge" / "train-00000.parquet")
    for f in [*base.glob("eval-*.parquet"), base / "stats.json", base / MARKER]:
        shutil.copy(f, run_dir / "merge" / f.name)
    link_stages(base_config, run_dir, ("tokenize", "generate"))


def read_tables(files: list[Path]) -> pa.Table:
    return pa.concat_tables([pq.read_table(f).cast(tokenized_arrow_schema()) for f in files])


def train_variant(base_config, run_dir: Path, settings: dict) -> dict:
    # Validated, so nested sections (train.dflash) become their models and bad values are refused.
    train_config = type(base_config.train).model_validate(settings)
    config = base_config.model_copy(update={"run_dir": str(run_dir), "train": train_config})
    started, cpu_started = time.monotonic(), time.process_time()
    train.run(config, quiet=True)
    wall, cpu = time.monotonic() - started, time.process_time() - cpu_started
    taus = read_metrics(RunPaths.of(config).train_metrics, "tau")
    best = max(taus, key=lambda r: (r["tau"], -r["step"]))
    return {
        "best": best["tau"],
        "best_step": best["step"],
        "last": taus[-1]["tau"],
        "per_prompt": best.get("per_prompt"),
        "wall": wall,
        "cpu": cpu,
    }


def doc_conversations() -> list[dict]:
    """The Python reference's topics as conversations: a question per topic, its text (cut at
    paragraphs to about 2,000 characters) as the answer."""
    from pydoc_data.topics import topics

    rows = []
    for name, text in sorted(topics.items()):
        answer = ""
        for paragraph in text.strip().split("\n\n"):
            if answer and len(answer) + len(paragraph) > 2000:
                break
            answer += ("\n\n" if answer else "") + paragraph
        question = f"Explain the Python language reference topic '{name}'."
        rows.append(
            {"id": name, "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}
        )
    return rows


def as_is_table(base_config, work: Path, base: dict) -> None:
    from eyas import generate, tokenize
    from eyas.config import DatasetConfig

    docs_run = work / "docs"
    docs_run.mkdir()
    source = docs_run / "docs.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in doc_conversations()))
    docs_config = base_config.model_copy(
        update={
            "run_dir": str(docs_run),
            "datasets": [DatasetConfig(name="docs", source=str(source), regenerate=False)],
        }
    )
    generate.run(docs_config, quiet=True)
    tokenize.run(docs_config, quiet=True)
    docs = RunPaths.of(docs_config).tokenized("docs")
    regenerated = sorted(RunPaths.of(base_config).merge_dir.glob("train-*.parquet"))
    _, generation_cpu = answer_again(base_config, work, base_config.generate.temperature)

    rows = []
    run_dir = variant_dir(work, "regenerated")
    assemble_corpus(base_config, run_dir, read_tables(regenerated))
    r = train_variant(base_config, run_dir, base)
    rows.append(("regenerated (the run's own)", pq.read_metadata(regenerated[0]).num_rows, generation_cpu, r))
    extra = round(base["max_steps"] * generation_cpu / r["cpu"])
    for name, files, steps in (
        ("as is (Python reference)", [docs], base["max_steps"] + extra),
        ("both", [*regenerated, docs], base["max_steps"]),
    ):
        run_dir = variant_dir(work, name)
        table = read_tables(files)
        assemble_corpus(base_config, run_dir, table)
        cost = generation_cpu if name == "both" else 0.0
        rows.append((name, table.num_rows, cost, train_variant(base_config, run_dir, {**base, "max_steps": steps})))
    print("\n| training data | samples | generation CPU s | train CPU s | total CPU s | best τ (step) |")
    print("|---|---|---|---|---|---|")
    for name, samples, cost, r in rows:
        print(
            f"| {name} | {samples} | {cost:.0f} | {r['cpu']:.0f} | {cost + r['cpu']:.0f} | "
            f"{r['best']:.3f} ({r['best_step']}) |",
            flush=True,
        )


def answer_again(base_config, work: Path, temperature: float) -> tuple[pa.Table, float]:
    """The run's prompts answered again at ``temperature`` and tokenized, its held-out prompts
    left out, with the generation's CPU seconds. Measured here because a stage marker records only
    its last run, which may have been a resume with nothing left to answer."""
    from eyas import generate, tokenize

    config = base_config.model_copy(
        update={
            "run_dir": str(work / f"answers at {temperature}"),
            "generate": base_config.generate.model_copy(update={"temperature": temperature}),
        }
    )
    started = time.process_time()
    generate.run(config, quiet=True)
    cost = time.process_time() - started
    tokenize.run(config, quiet=True)
    held_out = read_tables(sorted(RunPaths.of(base_config).merge_dir.glob("eval-*.parquet"))).column("id")
    table = read_tables([RunPaths.of(config).tokenized(d.name) for d in config.datasets])
    return table.filter(pc.invert(pc.is_in(table.column("id"), held_out))), cost


def temperature_table(base_config, work: Path, base: dict, temperatures: list[float]) -> None:
    rows = []
    for temperature in [base_config.generate.temperature, *temperatures]:
        table, cost = answer_again(base_config, work, temperature)
        run_dir = variant_dir(work, f"temperature {temperature}")
        assemble_corpus(base_config, run_dir, table)
        rows.append((temperature, table.num_rows, cost, train_variant(base_config, run_dir, base)))
    print("\n| answers sampled at temperature | samples | generation CPU s | train CPU s | best τ (step) |")
    print("|---|---|---|---|---|")
    for temperature, samples, cost, r in rows:
        print(
            f"| {temperature:g} | {samples} | {cost:.0f} | {r['cpu']:.0f} | {r['best']:.3f} ({r['best_step']}) |",
            flush=True,
        )


def warm_start_table(base_config, work: Path, base: dict) -> None:
    """From scratch on the whole train split, against half of it then a warm start on the other
    half (``train.init_from``), for as many steps in all or fewer."""
    table = read_tables(sorted(RunPaths.of(base_config).merge_dir.glob("train-*.parquet")))
    halves = [table.take(list(range(start, table.num_rows, 2))) for start in (0, 1)]
    steps = base["max_steps"]
    first = "first half, from scratch"
    plan = [
        ("all, from scratch", table, steps, None, 1.0),
        (first, halves[0], steps // 2, None, 1.0),
        ("second half, warm-started from the first", halves[1], steps // 2, first, 1.0),
        ("second half, warm-started, fewer steps", halves[1], steps // 4, first, 1.0),
        ("second half, warm-started, lr ÷3", halves[1], steps // 2, first, 1 / 3),
    ]
    done: dict[str, tuple[Path, dict]] = {}
    print("\n| training | samples | steps | train CPU s | CPU s in all | best τ (step) |")
    print("|---|---|---|---|---|---|")
    for name, data, n, source, lr_factor in plan:
        run_dir = variant_dir(work, name)
        assemble_corpus(base_config, run_dir, data)
        settings = {**base, "max_steps": n, "lr": base["lr"] * lr_factor}
        earlier = 0.0
        if source is not None:
            settings["init_from"] = str(RunPaths(done[source][0]).train_final)
            earlier = done[source][1]["cpu"]
        r = train_variant(base_config, run_dir, settings)
        done[name] = (run_dir, r)
        print(
            f"| {name} | {data.num_rows} | {n} | {r['cpu']:.0f} | {earlier + r['cpu']:.0f} | "
            f"{r['best']:.3f} ({r['best_step']}) |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True, help="config of a run whose merge is done")
    parser.add_argument("--only", nargs="*", help="row names to run (default: all)")
    parser.add_argument("--as-is", action="store_true", help="add the regenerated vs as-is table")
    parser.add_argument(
        "--temperature", type=float, nargs="*", default=[], help="add a table of answers at these temperatures"
    )
    parser.add_argument("--warm-start", action="store_true", help="add the warm start vs from scratch table")
    parser.add_argument("--tau-prompts", type=int, default=16, help="held-out prompts τ is measured on")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    base_config, base = online_base(args.run, "train_recipe.py", args.tau_prompts)
    work = Path(tempfile.mkdtemp(prefix="eyas-recipe-"))
    names = args.only if args.only is not None else list(VARIANTS)
    print(
        f"corpus: {RunPaths.of(base_config).merge_dir}; base: ttt_steps {base['ttt_steps']}, lr {base['lr']}, "
        f"draft vocab {base['draft_vocab_size']}, {base['max_steps']} steps of {base['batch_size']}; "
        f"τ on {args.tau_prompts} held-out prompts, {base['tau_draft_tokens']} draft tokens, "
        f"{base['tau_new_tokens']} new tokens each\n"
    )
    print("| setting | best τ (step) | last τ | train wall s | train CPU s |")
    print("|---|---|---|---|---|")
    for name in names:
        run_dir = variant_dir(work, name)
        link_stages(base_config, run_dir, ("merge", "tokenize", "generate"))
        change = dict(VARIANTS[name])
        config = base_config
        if "aux_layers" in change:
            extract = base_config.extract.model_copy(update={"aux_layers": change.pop("aux_layers")})
            config = base_config.model_copy(update={"extract": extract})
        r = train_variant(config, run_dir, settings_for(base, change))
        print(
            f"| {name} | {r['best']:.3f} ({r['best_step']}) | {r['last']:.3f} | {r['wall']:.0f} | {r['cpu']:.0f} |",
            flush=True,
        )
    if args.as_is:
        as_is_table(base_config, work, base)
    if args.temperature:
        temperature_table(base_config, work, base, args.temperature)
    if args.warm_start:
        warm_start_table(base_config, work, base)


if __name__ == "__main__":
    main()
