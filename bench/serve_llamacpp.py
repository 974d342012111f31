"""Decode speed in llama.cpp with eyas's drafters: what drafting buys on this CPU, and why.

For each run given (its exported drafter and its held-out prompts), on the embedded target as
an f32 GGUF (equal precision: outputs must not change) and as the Q4_1 file it ships as, and
all in one set of servers: plain decoding, the drafter in each precision (f32, f16, q8_0) at
draft lengths 1-3, and llama.cpp's ngram-mod and ngram-simple, measured side by side by
:func:`eyas.eval.llamacpp_engine.measure` (fresh servers each round, every prompt to every
server in turn, median tokens/s over rounds).

Why the speed-up is what it is: a speculative step drafting n tokens yields τ tokens and takes
T(n) = τ ÷ tokens/s, against one plain step's 1 ÷ plain tokens/s, so drafting pays only when τ
exceeds the break-even T(n) ÷ plain step. T(n) is one verification pass over n + 1 tokens,
V(n+1), plus n draft steps, D: V(k) is measured directly — llama.cpp's time to process k new
tokens after a cached prompt (logits for the last position only, so a lower bound of a
verification pass) — and D = (T(n) − V(n+1)) ÷ n, the median over n = 1..3.

Usage: ``.venv/bin/python bench/serve_llamacpp.py [--run runs/demo] [--config
examples/smollm2-full.yaml] [--prompts 8] [--rounds 2] [--max-new-tokens 64]`` (after ``make
demo`` or the runs; CPU).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from itertools import product
from pathlib import Path

from eyas.config import load_config
from eyas.eval.llamacpp_engine import PLAIN, drafting, draftless, measure
from eyas.eval.prompts import load_eval_prompts
from eyas.target import load_tokenizer
from eyas.target.llamacpp import LlamaServer, convert, find_llamacpp, target_ggufs

PRECISIONS = ("f32", "f16", "q8_0")
DRAFT_LENGTHS = (1, 2, 3)


def verification_ms(llamacpp, target: Path, args: list[str], prompt: list[int], work: Path) -> dict[int, float]:
    """V(k): milliseconds to process k new tokens after a cached prompt, k = 2..4 (median of 5)."""
    costs = {}
    with LlamaServer(llamacpp, ["-m", str(target), "--no-warmup", *args], work / "v.log", 600, 2) as server:
        server.complete(prompt, 1, cache_prompt=True)
        for k in (2, 3, 4):
            runs = []
            for i in range(5):
                server.complete(prompt, 1, cache_prompt=True)  # the cache holds exactly `prompt` again
                extra = prompt[1 : 1 + k] if i % 2 else prompt[2 : 2 + k]
                runs.append(server.complete(prompt + extra, 1, cache_prompt=True)["timings"]["prompt_ms"])
            costs[k] = statistics.median(runs)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", action="append", type=Path, help="a run directory made by `eyas demo` (its demo.yaml)")
    parser.add_argument("--config", action="append", type=Path, help="a run's config (instead of --run)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, help="default: the config's eval.max_new_tokens")
    args = parser.parse_args()
    configs = list(args.config or []) + [r / "demo.yaml" for r in args.run or []]
    llamacpp = find_llamacpp(None)
    with tempfile.TemporaryDirectory(prefix="eyas-llamacpp-bench-") as work:
        for config_path in configs or [Path("runs/demo/demo.yaml")]:
            bench(config_path, args, llamacpp, Path(work))


def bench(config_path: Path, args: argparse.Namespace, llamacpp, work: Path) -> None:
    """One run's two tables: each configuration's speed, then the step costs and break-even τ."""
    base = load_config(config_path)
    sizes = {"max_prompts": args.prompts, "llamacpp_repeats": args.rounds, "num_draft_tokens": max(DRAFT_LENGTHS)}
    sizes |= {"max_new_tokens": args.max_new_tokens} if args.max_new_tokens else {}
    config = base.model_copy(update={"eval": base.eval.model_copy(update=sizes)})
    prompts = load_eval_prompts(config, load_tokenizer(config.target))
    ggufs = target_ggufs(config.target, llamacpp, "f32")
    drafter = Path(config.run_dir) / "export" / "sglang"
    drafts = {p: convert(llamacpp, drafter, work / f"draft-{p}.gguf", p, target_dir=ggufs.hf_dir) for p in PRECISIONS}
    drafting = {_name(p, n): drafting(d, "draft-eagle3", n) for p, d in drafts.items() for n in DRAFT_LENGTHS}
    servers = {PLAIN: [], **drafting, **draftless()}
    # --no-repack everywhere: repacking quantized weights (the Q4_1 target, the q8_0 drafter) dies
    # with an illegal instruction on these CPUs; f32 weights are never repacked.
    targets = {"f32": ggufs.same_precision, "Q4_1 (shipped)": ggufs.shipped}
    print(
        f"\n## {config_path}: {len(prompts)} held-out prompts, {config.eval.max_new_tokens} new tokens, "
        f"{args.rounds} rounds, greedy\n"
    )
    print("| target | drafter | configuration | τ | tok/s | speed-up | lossless |")
    print("|---|---|---|---|---|---|---|")
    costs = {}
    for target_name, target in targets.items():
        v = verification_ms(llamacpp, target, ["--no-repack"], prompts[0].input_ids, work)
        section = measure(config, llamacpp, target, servers, prompts, work, ("--no-repack",))
        plain = section["plain"]["tokens_per_s"]
        print(f"| {target_name} | — | plain | 1.00 | {plain:.1f} | 1.00× | reference |")
        for name, m in section["methods"].items():
            lossless = f"{m['lossless']['identical']}/{m['lossless']['checked']}"
            print(
                f"| {target_name} | {name.split(' ')[1].rstrip(',') if name.startswith('eagle3') else '—'} | {name} "
                f"| {m['tau']:.2f} | {m['tokens_per_s']:.1f} | {m['speedup']:.2f}× | {lossless} |"
            )
        steps = {key: section["methods"][_name(*key)] for key in product(PRECISIONS, DRAFT_LENGTHS)}
        costs[target_name] = (
            1000 / plain,
            v,
            {k: (m["tau"] / m["tokens_per_s"] * 1000, m["tau"]) for k, m in steps.items()},
        )
    print(
        "\n| target | plain step ms | V(2) / V(3) / V(4) ms | drafter | D ms | break-even τ at n=1 / 2 / 3 "
        "| measured τ at n=1 / 2 / 3 |"
    )
    print("|---|---|---|---|---|---|---|")
    for target_name, (plain_step, v, steps) in costs.items():
        for precision in PRECISIONS:
            d = statistics.median((steps[(precision, n)][0] - v[n + 1]) / n for n in DRAFT_LENGTHS)
            even = " / ".join(f"{steps[(precision, n)][0] / plain_step:.2f}" for n in DRAFT_LENGTHS)
            taus = " / ".join(f"{steps[(precision, n)][1]:.2f}" for n in DRAFT_LENGTHS)
            verify = " / ".join(f"{v[k]:.1f}" for k in (2, 3, 4))
            print(f"| {target_name} | {plain_step:.1f} | {verify} | {precision} | {d:.1f} | {even} | {taus} |")


def _name(precision: str, n: int) -> str:
    return f"eagle3 {precision}, n={n}"


if __name__ == "__main__":
    main()
