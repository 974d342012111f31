"""The drafter families (EAGLE-3, DFlash, DSpark) on one corpus and one CPU budget: held-out τ and the llama.cpp speed-up.

Both drafters train online (states cached) on the merged corpus of a run whose merge is done
(``--run CONFIG``; ``make demo`` leaves ``runs/demo/demo.yaml``), one after the other in one
process, each for the config's own steps and batch. Each row then goes through ``eyas eval``
with ``engine: llamacpp``: eyas's own speculative decoder on the merge's held-out prompts (τ,
greedy, lossless check), then the GGUF export in ``llama-server`` beside plain decoding and
llama.cpp's n-gram speculation, at draft lengths 1 … ``eval.num_draft_tokens`` (a DFlash drafter
drafts at most its block size − 1 per pass, a DSpark one its block size). Speed-ups are medians over the config's
``eval.llamacpp_repeats`` rounds, measured side by side, so they compare across rows; run
nothing else on the machine meanwhile.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python bench/drafter_families.py --run runs/demo/demo.yaml
[--only NAME ...]``. On the demo corpus each row takes about 15 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from train_recipe import link_stages, train_variant, variant_dir

from eyas import eval as evaluation
from eyas.config import load_config
from eyas.eval.llamacpp_engine import is_drafted
from eyas.paths import RunPaths

ROWS: dict[str, dict] = {
    "EAGLE-3": {"drafter": "eagle3"},
    "DFlash, 1 layer": {"drafter": "dflash", "dflash": {"layers": 1, "block_size": 4, "anchors": 48}, "lr": 2e-3},
    "DFlash, 2 layers": {"drafter": "dflash", "dflash": {"layers": 2, "block_size": 4, "anchors": 48}, "lr": 2e-3},
    "DSpark, 1 layer": {"drafter": "dspark", "dspark": {"layers": 1, "block_size": 4, "anchors": 48}, "lr": 2e-3},
}
"""Row name → changes to the config's train section."""


def evaluate(base_config, run_dir: Path) -> dict:
    """``eyas eval`` of the row's ``train/final`` in eyas and in llama.cpp."""
    eval_cfg = base_config.eval.model_copy(update={"engine": "llamacpp", "draft": str(run_dir / "train" / "final")})
    config = base_config.model_copy(update={"run_dir": str(run_dir), "eval": eval_cfg})
    return evaluation.run(config, quiet=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True, help="config of a run whose merge is done")
    parser.add_argument("--only", nargs="*", help="row names to run (default: all)")
    parser.add_argument("--tau-prompts", type=int, default=16, help="held-out prompts training measures τ on")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    base_config = load_config(Path(args.run))
    if base_config.extract.mode != "online":
        raise SystemExit(f"{args.run}: bench/drafter_families.py trains online; set extract.mode: online")
    base = base_config.train.model_dump() | {"cache_states": True, "tau_prompts": args.tau_prompts}
    work = Path(tempfile.mkdtemp(prefix="eyas-families-"))
    k = base_config.eval.num_draft_tokens
    print(
        f"corpus: {RunPaths.of(base_config).merge_dir}; {base['max_steps']} steps of {base['batch_size']} each; "
        f"eval: {base_config.eval.max_prompts} held-out prompts, {base_config.eval.max_new_tokens} new tokens, "
        f"llama.cpp medians of {base_config.eval.llamacpp_repeats} rounds\n"
    )
    print(
        f"| drafter | train CPU s | τ in training (step) | τ eyas, k={k} | τ llama.cpp, n={k} | "
        "llama.cpp speed-up, n=1 … k | lossless in llama.cpp |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in args.only or list(ROWS):
        run_dir = variant_dir(work, name)
        link_stages(base_config, run_dir, ("merge", "tokenize", "generate"))
        trained = train_variant(base_config, run_dir, base | ROWS[name])
        report = evaluate(base_config, run_dir)
        family = ROWS[name]["drafter"]
        served = report["llamacpp"]["methods"]
        drafted = [served[f"{family}, n={n}"] for n in range(1, k + 1)]
        speedups = " / ".join(f"{m['speedup']:.2f}×" for m in drafted)
        lossless = all(not m["lossless"]["mismatched"] for m in served.values())
        print(
            f"| {name} | {trained['cpu']:.0f} | {trained['best']:.3f} ({trained['best_step']}) | "
            f"{report['methods'][family]['tau']:.3f} | {drafted[-1]['tau']:.3f} | {speedups} | "
            f"{'yes' if lossless else 'NO'} |",
            flush=True,
        )
    ngram = {n: m for n, m in served.items() if not is_drafted(n)}
    print(
        "\nllama.cpp's own speculation in the last row's run: "
        + ", ".join(f"{n} {m['speedup']:.2f}×" for n, m in ngram.items())
    )


if __name__ == "__main__":
    main()
