"""The drafter families (EAGLE-3, EAGLE-3.1, DFlash, DSpark, DFlash2) on one corpus and one CPU budget: held-out τ, and τ and decode speed-up in llama.cpp on the f32 and the shipped Q4_1 target.

Each drafter trains online (states cached) on the merged corpus of a run whose merge is done
(``--run CONFIG``; ``make demo`` leaves ``runs/demo/demo.yaml``), one after the other in one
process, each for the config's own steps and batch. Each row then goes through ``eyas eval``
with ``engine: llamacpp``: eyas's own speculative decoder on the merge's held-out prompts (τ,
greedy, lossless check), then the GGUF export in ``llama-server`` on the f32 target beside plain
decoding and llama.cpp's n-gram speculation, at draft lengths 1 … ``eval.num_draft_tokens``
(a DFlash or DFlash2 drafter drafts at most its block size − 1 per pass) and each
``eval.llamacpp_p_min`` (the family's own threshold: the draft token's probability; DSpark's
confidence head; DFlash2's selector). The same
configurations are then measured on the Q4_1 GGUF the embedded target ships as (``--no-repack``
everywhere: repacking quantized weights dies with an illegal instruction on these CPUs), against
plain Q4_1 decoding: lossless there means equal to plain decoding of the same Q4_1 file.

Speed-ups are medians over the config's ``eval.llamacpp_repeats`` rounds, measured side by side
(every prompt to every server in turn), so they compare across rows; run nothing else on the
machine meanwhile. "Best" is the drafted configuration with the highest median speed.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python bench/drafter_families.py --run runs/demo/demo.yaml
[--only NAME ...]``. On the demo corpus each row takes about 25 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from train_recipe import link_stages, online_base, train_variant, variant_dir

from eyas import eval as evaluation
from eyas.eval.llamacpp_engine import is_drafted, measure
from eyas.eval.prompts import load_eval_prompts
from eyas.paths import RunPaths
from eyas.target import load_tokenizer
from eyas.target.llamacpp import find_llamacpp, target_ggufs

ROWS: dict[str, dict] = {
    "EAGLE-3": {"drafter": "eagle3"},
    "EAGLE-3.1 (norm_before_fc)": {"drafter": "eagle3", "eagle3": {"norm_before_fc": True}},
    "DFlash, 1 layer": {"drafter": "dflash", "dflash": {"layers": 1, "block_size": 4, "anchors": 48}, "lr": 2e-3},
    "DSpark, 1 layer": {"drafter": "dspark", "dspark": {"layers": 1, "block_size": 4, "anchors": 48}, "lr": 2e-3},
    "DFlash2, 1 layer": {"drafter": "dflash2", "dflash2": {"layers": 1, "block_size": 4, "anchors": 48}, "lr": 2e-3},
}
"""Row name → changes to the config's train section. EAGLE-3.1's post-norm feedback
(``norm_output``) is left out: the pinned llama.cpp does not read it, so it has no GGUF export."""


def evaluate(base_config, run_dir: Path) -> dict:
    """``eyas eval`` of the row's ``train/final`` in eyas and in llama.cpp (f32 target)."""
    eval_cfg = base_config.eval.model_copy(update={"engine": "llamacpp", "draft": str(run_dir / "train" / "final")})
    config = base_config.model_copy(update={"run_dir": str(run_dir), "eval": eval_cfg})
    return evaluation.run(config, quiet=True)


def on_shipped_target(base_config, run_dir: Path, f32: dict) -> dict:
    """The configurations of the f32 section, with the same draft GGUF, on the shipped Q4_1 target."""
    config = base_config.model_copy(update={"run_dir": str(run_dir)})
    llamacpp = find_llamacpp(config.target.llamacpp)
    drafter_dir = run_dir / "train" / "final"
    steps = evaluation.draft_length(config, drafter_dir)
    configs = evaluation.llamacpp_configurations(config, drafter_dir, Path(f32["draft"]), steps)
    prompts = load_eval_prompts(config, load_tokenizer(config.target))
    shipped = target_ggufs(config.target, llamacpp, "f32").shipped
    out_dir = run_dir / "eval" / "q4_1"
    out_dir.mkdir(parents=True, exist_ok=True)
    return measure(config, llamacpp, shipped, configs, prompts, out_dir, ("--no-repack",))


def best_cells(section: dict) -> list[str]:
    """Best setting, its τ and speed-up, and the lossless count over every drafted configuration."""
    best = section["methods"][section["best_draft"]]
    drafted = [m["lossless"] for n, m in section["methods"].items() if is_drafted(n)]
    identical = sum(c["identical"] + len(c["float_ties"]) for c in drafted)
    checked = sum(c["checked"] for c in drafted)
    setting = section["best_draft"].split(", ", 1)[1]
    return [setting, f"{best['tau']:.3f}", f"{best['speedup']:.2f}×", f"{identical}/{checked}"]


def sweep_cell(section: dict) -> str:
    """Every drafted configuration's speed-up, draft lengths in order, one group per p-min."""
    groups: dict[str, list[str]] = {}
    for name, m in section["methods"].items():
        if is_drafted(name):
            p_min = name.split("p-min=")[1] if "p-min=" in name else "0"
            groups.setdefault(p_min, []).append(f"{m['speedup']:.2f}")
    return "; ".join(f"p {p}: " + " / ".join(v) for p, v in groups.items())


def ngram_cell(section: dict) -> str:
    return ", ".join(f"{n} {m['speedup']:.2f}×" for n, m in section["methods"].items() if not is_drafted(n))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True, help="config of a run whose merge is done")
    parser.add_argument("--only", nargs="*", help="row names to run (default: all)")
    parser.add_argument("--tau-prompts", type=int, default=16, help="held-out prompts training measures τ on")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    base_config, base = online_base(args.run, "drafter_families.py", args.tau_prompts)
    work = Path(tempfile.mkdtemp(prefix="eyas-families-"))
    cfg = base_config.eval
    print(
        f"corpus: {RunPaths.of(base_config).merge_dir}; {base['max_steps']} steps of {base['batch_size']} each; "
        f"eval: {cfg.max_prompts} held-out prompts, {cfg.max_new_tokens} new tokens, draft lengths 1 … "
        f"{cfg.num_draft_tokens}, p-min {cfg.llamacpp_p_min}, llama.cpp medians of {cfg.llamacpp_repeats} rounds\n"
    )
    print(
        "| drafter | train CPU s | τ in training (step) | τ eyas | f32: best setting | τ | speed-up | lossless "
        "| Q4_1: best setting | τ | speed-up | lossless |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    sweeps = []
    for name in args.only or list(ROWS):
        run_dir = variant_dir(work, name)
        link_stages(base_config, run_dir, ("merge", "tokenize", "generate"))
        trained = train_variant(base_config, run_dir, base | ROWS[name])
        report = evaluate(base_config, run_dir)
        f32, q4_1 = report["llamacpp"], on_shipped_target(base_config, run_dir, report["llamacpp"])
        eyas_tau = report["methods"][ROWS[name]["drafter"]]["tau"]
        cells = [f"{trained['cpu']:.0f}", f"{trained['best']:.3f} ({trained['best_step']})", f"{eyas_tau:.3f}"]
        print(f"| {name} | " + " | ".join(cells + best_cells(f32) + best_cells(q4_1)) + " |", flush=True)
        sweeps.append((name, f32, q4_1))
    print(
        "\nEvery drafted configuration's speed-up (draft length 1 … k in order, per p-min), and n-gram speculation:\n"
    )
    print("| drafter | target | plain tok/s | drafted speed-ups | llama.cpp n-gram |")
    print("|---|---|---|---|---|")
    for name, f32, q4_1 in sweeps:
        for target, section in (("f32", f32), ("Q4_1", q4_1)):
            plain = section["plain"]["tokens_per_s"]
            print(f"| {name} | {target} | {plain:.1f} | {sweep_cell(section)} | {ngram_cell(section)} |")


if __name__ == "__main__":
    main()
