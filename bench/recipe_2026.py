"""The 2026 recipe levers at equal data: one table of held-out τ, each row against today's default.

Every row is a real ``eyas.train.run`` on the merged corpus of a finished run (``--run CONFIG``;
``make demo`` leaves ``runs/demo/demo.yaml``), online with the states cached, with the config's
own ``train`` section and one group of settings changed: the objective (``train.loss``), the
position weighting (``train.position_weighting``), the optimizer (``train.optimizer``), and the
combinations. τ is what training measures on the merge's held-out prompts (greedy, 3 draft
tokens), for the drafter ``train/final`` keeps. Each τ comes with its standard error over prompts
(bootstrap), and each row with a paired comparison against the first row on the same prompts:
Δτ, its standard error from resampling the prompts of both together, and on how many prompts the
row decoded in fewer passes and in more. Rows run one after another in one process, so their
train CPU seconds compare; run nothing else on the machine meanwhile.

The data levers are rows too (``DATA_LEVERS``): the same training on another corpus that the
target writes for the row with ``eyas generate``: the base run's train prompts (its held-out
prompts never answered), or a seeded share of them, answered ``generate.samples_per_prompt``
times at a temperature above 0, then tokenized. Their cost is the answers and answer tokens the
target wrote, which the table gives; the rows that ask for several answers to fewer prompts
cost what one answer to every prompt costs. All data rows share one run directory, so a row takes
back the answers an earlier row made (generate's own selection) instead of paying for them again.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python bench/recipe_2026.py --run runs/demo/demo.yaml
[--family eagle3] [--only NAME ...] [--json FILE]``. A demo-sized row takes 5 to 12 minutes on 2 cores,
a data row as much again for the answers it makes; with ``--json`` an interrupted bench reruns only
the rows it has not recorded with these settings.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from train_recipe import assemble_corpus, link_stages, online_base, read_tables, train_variant, variant_dir

from eyas.config import RunConfig
from eyas.merge.plan import base_prompt_id, hash64
from eyas.paths import RunPaths

LEVERS: dict[str, dict] = {
    "today's default (kl_div, geometric, AdamW)": {},
    "loss: rkl": {"loss": "rkl"},
    "loss: jsd": {"loss": "jsd"},
    "loss: tv": {"loss": "tv"},
    "loss: nla": {"loss": "nla"},
    "loss: lk_hybrid": {"loss": "lk_hybrid"},
    "loss: ce": {"loss": "ce"},
    "loss: {ce: 0.1, tv: 0.9}": {"loss": {"ce": 0.1, "tv": 0.9}},
    "position_weighting: dpace": {"position_weighting": "dpace"},
    "optimizer: muon": {"optimizer": "muon"},
    "keep: the flattest half (120 steps, the default's epochs)": {"keep": 0.5, "max_steps": 120},
    "keep: a random half (120 steps), the control": {"keep": 0.5, "keep_by": "random", "max_steps": 120},
    "keep: the flattest three quarters (180 steps)": {"keep": 0.75, "max_steps": 180},
}
"""Row name → changes to the config's train section, for every family. The ``keep`` rows train
the share they keep for as many epochs as the default trains the whole split: the training time
the share saves is the lever, τ what it costs."""

FAMILY_LEVERS: dict[str, dict[str, dict]] = {
    "eagle3": {
        "norm_before_fc (EAGLE-3.1 as llama.cpp serves it)": {"eagle3": {"norm_before_fc": True}},
        "norm_before_fc and norm_before_residual (as llama.cpp serves them)": {
            "eagle3": {"norm_before_fc": True, "norm_before_residual": True}
        },
        "speculators' draft model (EAGLE-3.1 and norm_before_residual)": {
            "eagle3": {"norm_before_fc": True, "norm_output": True, "norm_before_residual": True}
        },
        "norm_before_fc and optimizer: muon": {"optimizer": "muon", "eagle3": {"norm_before_fc": True}},
        "fc_norm (a norm per aux state)": {"eagle3": {"fc_norm": True}},
        "fc_norm and norm_output (EAGLE-3.1 as vLLM and SGLang serve it)": {
            "eagle3": {"fc_norm": True, "norm_output": True}
        },
        "fc_norm and optimizer: muon": {"optimizer": "muon", "eagle3": {"fc_norm": True}},
        "norm_before_fc and optimizer: muon, twice the steps (480)": {
            "optimizer": "muon",
            "eagle3": {"norm_before_fc": True},
            "max_steps": 480,
        },
    },
}
"""Rows only a family has."""

DATA_LEVERS: dict[str, dict] = {
    "answers: 1 per prompt at temperature 0.7": {"temperature": 0.7, "samples_per_prompt": 1, "share": 1.0},
    "answers: 2 per prompt at 0.7, half the prompts": {"temperature": 0.7, "samples_per_prompt": 2, "share": 0.5},
    "answers: 4 per prompt at 0.7, a quarter of the prompts": {
        "temperature": 0.7,
        "samples_per_prompt": 4,
        "share": 0.25,
    },
    "answers: 2 per prompt at 0.7, every prompt (2× the answers)": {
        "temperature": 0.7,
        "samples_per_prompt": 2,
        "share": 1.0,
    },
}
"""Row name → the corpus the target writes for it: ``generate.temperature``,
``generate.samples_per_prompt`` and the share of the base run's train prompts answered."""

BOOTSTRAP = 2000


def pooled(per_prompt: list[list[int]], picks: list[int]) -> float:
    generated = sum(per_prompt[i][0] for i in picks)
    passes = sum(per_prompt[i][1] for i in picks)
    return generated / passes if passes else 1.0


def compare(row: list[list[int]], base: list[list[int]], seed: int = 0) -> dict:
    """τ and its bootstrap standard error over prompts; Δτ against ``base`` on the same resamples;
    prompts where the row needed fewer verification passes than ``base``, and more."""
    rng = random.Random(seed)
    n = len(row)
    every = list(range(n))
    taus, deltas = [], []
    for _ in range(BOOTSTRAP):
        picks = [rng.randrange(n) for _ in every]
        taus.append(pooled(row, picks))
        deltas.append(taus[-1] - pooled(base, picks))

    def se(values: list[float]) -> float:
        mean = sum(values) / len(values)
        return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5

    return {
        "tau": pooled(row, every),
        "se": se(taus),
        "delta": pooled(row, every) - pooled(base, every),
        "delta_se": se(deltas),
        "better": sum(r[1] < b[1] for r, b in zip(row, base)),
        "worse": sum(r[1] > b[1] for r, b in zip(row, base)),
    }


def answered_corpus(base_config: RunConfig, work: Path, lever: dict) -> pa.Table:
    """The row's corpus, tokenized (every row a train sample).

    The base run's train prompts are its datasets' rows less the prompts its merge held out,
    taken in a seeded order so a smaller share is a subset of a larger one. They are answered in
    one run directory for every data row (``work/answers``), by the stages a user runs."""
    from eyas import generate, tokenize

    base_paths = RunPaths.of(base_config)
    held_out = {
        base_prompt_id(i) for i in read_tables(sorted(base_paths.merge_dir.glob("eval-*.parquet")))["id"].to_pylist()
    }
    answers = work / "answers"
    answers.mkdir(exist_ok=True)
    datasets = []
    for d in base_config.datasets:
        rows = [json.loads(line) for line in Path(d.source).read_text().splitlines() if line.strip()]
        if any("id" not in row for row in rows):
            raise SystemExit(f"{d.source}: the data rows need prompt rows with their own ids, as the demo's")
        train = sorted((r for r in rows if r["id"] not in held_out), key=lambda r: hash64(0, "share", r["id"]))
        kept = train[: round(lever["share"] * len(train))]
        source = answers / f"{d.name}.jsonl"
        source.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))
        datasets.append(d.model_copy(update={"source": str(source), "max_prompts": None}))
    sampling = {"temperature": lever["temperature"], "samples_per_prompt": lever["samples_per_prompt"]}
    config = base_config.model_copy(
        update={
            "run_dir": str(answers),
            "datasets": datasets,
            "generate": base_config.generate.model_copy(update=sampling),
        }
    )
    generate.run(config, quiet=True)
    tokenize.run(config, quiet=True)
    return read_tables([RunPaths.of(config).tokenized(d.name) for d in datasets])


def written(table: pa.Table) -> dict:
    """What the target wrote for a corpus: its answers and their tokens (the cost a user pays)."""
    return {"answers": table.num_rows, "answer_tokens": int(pc.sum(table["completion_tokens"]).as_py())}


def data_row(base_config: RunConfig, work: Path, name: str, settings: dict) -> dict:
    table = answered_corpus(base_config, work, DATA_LEVERS[name])
    run_dir = variant_dir(work, name)
    assemble_corpus(base_config, run_dir, table)
    return train_variant(base_config, run_dir, settings) | written(table)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True, help="config of a run whose merge is done")
    parser.add_argument("--family", default="eagle3", help="train.drafter of every row")
    parser.add_argument("--only", nargs="*", help="rows to run after the first, in this order (default: all)")
    parser.add_argument(
        "--json",
        type=Path,
        help="also write every row's figures here; a rerun keeps the rows it holds with the same settings",
    )
    parser.add_argument("--tau-prompts", type=int, default=16, help="held-out prompts τ is measured on")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    base_config, base = online_base(args.run, "recipe_2026.py", args.tau_prompts)
    base["drafter"] = args.family
    levers = LEVERS | FAMILY_LEVERS.get(args.family, {}) | {n: {} for n in DATA_LEVERS}
    first = next(iter(levers))
    names = [first, *(n for n in (levers if args.only is None else args.only) if n != first)]
    if unknown := [n for n in names if n not in levers]:
        raise SystemExit(f"--only: no row named {unknown[0]!r}; rows: {', '.join(levers)}")
    work = Path(tempfile.mkdtemp(prefix="eyas-recipe-2026-"))
    print(
        f"{args.family} on {args.run}: {base['max_steps']} steps of {base['batch_size']}, "
        f"τ on {args.tau_prompts} held-out prompts, {base['tau_draft_tokens']} draft tokens, "
        f"{base['tau_new_tokens']} new tokens each; Δτ paired against the first row\n"
    )
    print(
        "| setting | τ ± SE | Δτ ± SE (paired) | prompts better / worse | best step | train CPU s | answers (tokens) |"
    )
    print("|---|---|---|---|---|---|---|")
    recorded = json.loads(args.json.read_text()) if args.json and args.json.is_file() else {}
    # The training rows train on the base run's own corpus: what the target wrote for it.
    own = written(read_tables(sorted(RunPaths.of(base_config).merge_dir.glob("train-*.parquet"))))
    results = {}
    for name in names:
        settings = base | levers[name]
        as_recorded = json.loads(json.dumps({**settings, **DATA_LEVERS.get(name, {})}, default=str))
        if recorded.get(name, {}).get("settings") == as_recorded:
            r = recorded[name]
        elif name in DATA_LEVERS:
            r = data_row(base_config, work, name, settings) | {"settings": as_recorded}
        else:
            run_dir = variant_dir(work, name)
            link_stages(base_config, run_dir, ("merge", "tokenize", "generate"))
            r = train_variant(base_config, run_dir, settings) | {"settings": as_recorded}
        c = compare(r["per_prompt"], results[first]["per_prompt"] if results else r["per_prompt"])
        results[name] = r | c
        print(
            f"| {name} | {c['tau']:.3f} ± {c['se']:.3f} | {c['delta']:+.3f} ± {c['delta_se']:.3f} | "
            f"{c['better']} / {c['worse']} | {r['best_step']} | {r['cpu']:.0f} | "
            f"{r.get('answers', own['answers'])} ({r.get('answer_tokens', own['answer_tokens']):,}) |",
            flush=True,
        )
        if args.json:
            args.json.write_text(json.dumps(recorded | results, indent=2))


if __name__ == "__main__":
    main()
