"""``eval.engine: llamacpp``: the drafter served by ``llama-server``, and the decode speed it buys there.

What a CPU user buys is tokens per second in the engine they run, drafter against none. Each
configuration runs in a ``llama-server`` of its own (speculation is a server setting), greedy,
all on the target GGUF that ``eyas export --format gguf``'s README serves, in the precision the
target's checkpoint declares (the drafter's too):

- ``plain``: the target alone — the speed baseline and the lossless reference;
- ``eagle3, n=k`` (or ``dflash, n=k``, ...) for k = 1 … the drafter's draft length: the GGUF
  export drafting k tokens (``eval.num_draft_tokens``, which a DFlash drafter caps at its block
  size − 1: :func:`eyas.eval.draft_length`), and ``eagle3, n=k, p-min=p`` for each other
  ``eval.llamacpp_p_min``: the draft cut at the first position the drafter is less sure of than p
  (its top probability; DSpark's confidence head), which on a small target can decide whether
  drafting pays at all;
- ``ngram-mod`` and ``ngram-simple``: llama.cpp's draftless speculation, what a drafter must beat.

Speed is measured side by side: in each of ``eval.llamacpp_repeats`` rounds every prompt goes
to every server in turn, so a shared machine's drift falls on all of them alike. A round's
speed is the tokens decoded after the first, over the generation time llama.cpp reports
(``timings.predicted_ms``; prompt processing is not decoding); the report gives each
configuration's median over the rounds and its speed-up over plain's median. τ and
per-position acceptance are llama.cpp's own counters (``/metrics``: 1 + accepted ÷
verification steps).

Lossless: every configuration's greedy output, in every round, equals plain's (its first
round's), prompt by prompt (the target and drafter share one precision). llama.cpp verifies a draft in one batched pass, whose matrix
products (tinyBLAS, used only for batches) sum in another order than one-token decoding's, so
where the target's top two logits are closer than that rounding, a speculative output may take
the runner-up. Those prompts are decoded once more, plainly, with the top two log-probabilities
at every token: an output that first departs where plain's top two were within
``eval.llamacpp_tie_margin`` nats, onto plain's runner-up, is reported as a float tie with its
margin; any other difference fails the check. (A llama.cpp built with ``-DGGML_LLAMAFILE=OFF``
decodes batches with the one-token kernels, and then every output is identical.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
from pathlib import Path

from eyas.config import RunConfig
from eyas.target.llamacpp import LlamaCpp, LlamaServer

log = logging.getLogger(__name__)

PLAIN = "plain"
NGRAM_TYPES = ("ngram-mod", "ngram-simple")


def configurations(draft: Path, k: int, family, p_mins: list[float]) -> dict[str, list[str]]:
    """Name -> the ``llama-server`` arguments that make it, ``k`` the drafter's draft length;
    ``family``: the drafter's (:class:`eyas.drafter.family.Family`), whose name the rows carry;
    ``p_mins``: the ``--spec-draft-p-min`` values each draft length is served at."""
    drafted = {
        drafted_name(family.name, n, p_min): drafting(draft, family.llamacpp_spec_type, n, p_min)
        for p_min in p_mins
        for n in range(1, k + 1)
    }
    return {PLAIN: [], **drafted, **draftless()}


def drafted_name(family: str, n: int, p_min: float = 0.0) -> str:
    """A drafted row's name: ``eagle3, n=2``, and ``eagle3, n=2, p-min=0.5`` with a threshold."""
    return f"{family}, n={n}" + (f", p-min={p_min:g}" if p_min else "")


def is_drafted(name: str) -> bool:
    """Whether a row of :func:`configurations` drafts with the drafter (not plain, not n-gram)."""
    return name != PLAIN and name not in NGRAM_TYPES


def draftless() -> dict[str, list[str]]:
    """llama.cpp's own speculation, which needs no drafter: the baseline a CPU user has already."""
    return {name: ["--spec-type", name] for name in NGRAM_TYPES}


def drafting(draft: Path, spec_type: str, n: int, p_min: float | None = None) -> list[str]:
    """The ``llama-server`` arguments that serve ``draft`` with ``--spec-type spec_type`` (a
    family's :attr:`~eyas.drafter.family.Family.llamacpp_spec_type`) drafting ``n`` tokens, cut
    where the drafter is less sure than ``p_min`` (None: llama.cpp's default, which has changed
    between releases, so eval always names it)."""
    p_min_args = [] if p_min is None else ["--spec-draft-p-min", f"{p_min:g}"]
    return ["-md", str(draft), "--spec-type", spec_type, "--spec-draft-n-max", str(n), *p_min_args]


def server_threads() -> int:
    """Threads every ``llama-server`` decodes with: all the cores, as a CPU user's server would (a
    timing measured with another count is not reused, see :func:`eyas.eval._in_llamacpp`)."""
    return os.cpu_count() or 1


def measure(
    config: RunConfig,
    llamacpp: LlamaCpp,
    target: Path,
    configs: dict[str, list[str]],
    prompts: list,
    out_dir: Path,
    server_args: tuple[str, ...] = (),
) -> dict:
    """Run every configuration (:func:`configurations`: name -> server arguments, ``plain``
    among them) on ``prompts``; the ``llamacpp`` section of the report.

    Each round starts its servers afresh: llama.cpp's n-gram speculation keeps what it has seen
    across requests, and prompts it saw in an earlier round would be copied, not predicted.
    ``server_args`` go to every server (``--no-repack`` for a target that needs it).
    """
    cfg = config.eval
    rounds: dict[str, list[tuple[int, float]]] = {name: [] for name in configs}
    outputs: dict[str, list[dict[str, list[int]]]] = {name: [] for name in configs}
    """Each configuration's outputs (prompt id -> tokens), one mapping per round."""
    counters: dict[str, list[dict]] = {name: [] for name in configs}
    for round_ in range(cfg.llamacpp_repeats):
        with contextlib.ExitStack() as stack:
            servers = {
                name: stack.enter_context(
                    start_server(
                        config,
                        llamacpp,
                        target,
                        [*server_args, *args],
                        prompts,
                        out_dir / log_name(name),
                        cfg.max_new_tokens,
                    )
                )
                for name, args in configs.items()
            }
            before = {name: server.counters() for name, server in servers.items()}
            totals = {name: [0, 0.0] for name in configs}
            for name in configs:
                outputs[name].append({})
            for prompt in prompts:
                for name, server in servers.items():
                    answer = server.complete(prompt.input_ids, cfg.max_new_tokens)
                    timings = answer["timings"]
                    totals[name][0] += max(timings["predicted_n"] - 1, 0)
                    totals[name][1] += timings["predicted_ms"]
                    outputs[name][-1][prompt.id] = answer["tokens"]
            for name, server in servers.items():
                rounds[name].append(tuple(totals[name]))
                counters[name].append(spent(before[name], server.counters()))
        log.info("llama.cpp: round %d of %d done", round_ + 1, cfg.llamacpp_repeats)
    reference = outputs[PLAIN][0]
    differing = [p for p in prompts if any(r[p.id] != reference[p.id] for runs in outputs.values() for r in runs)]
    probs = (
        plain_top2(config, llamacpp, target, server_args, differing, out_dir, cfg.max_new_tokens) if differing else {}
    )
    return _section(configs, rounds, outputs, counters, probs, prompts, target, cfg)


def start_server(
    config: RunConfig,
    llamacpp: LlamaCpp,
    target: Path,
    args: list[str],
    prompts: list,
    log_path: Path,
    max_new_tokens: int,
    threads: int | None = None,
    slots: int | None = None,
):
    """A fresh server for one configuration, past its one-off start-up costs (a short untimed
    completion of a prompt's first token alone, which teaches the n-gram methods nothing), with
    ``threads`` (default :func:`server_threads`) and room for the longest prompt and
    ``max_new_tokens`` in each of ``slots`` requests in flight (``-np``; None: llama-server's
    default)."""
    context = (max(len(p.input_ids) for p in prompts) + max_new_tokens + 16) * (slots or 1)
    common = ["-m", str(target), "-c", str(context), "--no-warmup", *(["-np", str(slots)] if slots else [])]
    timeout = config.target.engine_timeout_s
    server = LlamaServer(llamacpp, common + args, log_path, timeout, threads or server_threads())
    try:
        server.complete(prompts[0].input_ids[:1], 4)
    except BaseException:
        server.close()
        raise
    return server


def plain_top2(
    config: RunConfig, llamacpp: LlamaCpp, target: Path, server_args, prompts: list, out_dir: Path, max_new_tokens: int
):
    """Prompt id -> plain decoding's output and, for each of its tokens, the two most likely
    tokens with their log-probabilities (untimed: asking for them costs time)."""
    log_path = out_dir / log_name("plain-top2")
    with start_server(config, llamacpp, target, list(server_args), prompts, log_path, max_new_tokens) as server:
        answers = {p.id: server.complete(p.input_ids, max_new_tokens, n_probs=2) for p in prompts}
    return {
        pid: (a["tokens"], [t["top_logprobs"] for t in a["completion_probabilities"]]) for pid, a in answers.items()
    }


def tie_margin(reference: list[int], output: list[int], top2: list[list[dict]], limit: float) -> float | None:
    """How far apart plain's top two logits were where ``output`` first departs from
    ``reference``, if that is at most ``limit`` and the two tokens are those two; else None (a
    real difference: elsewhere, onto another token, or a different length)."""
    first = next((i for i, (a, b) in enumerate(zip(reference, output)) if a != b), None)
    if first is None or first >= len(top2) or len(top2[first]) < 2:
        return None
    best, runner_up = top2[first][:2]
    if {best["id"], runner_up["id"]} != {reference[first], output[first]}:
        return None
    margin = abs(best["logprob"] - runner_up["logprob"])
    return margin if margin <= limit else None


def lossless(prompts: list, outputs: dict, reference: dict, probs: dict, limit: float) -> dict:
    """Prompts identical to plain, those that depart at a float tie (with the margin), and the rest."""
    ties, mismatched = [], []
    for p in prompts:
        if outputs[p.id] == reference[p.id]:
            continue
        plain_again, top2 = probs[p.id]
        margin = tie_margin(reference[p.id], outputs[p.id], top2, limit) if plain_again == reference[p.id] else None
        if margin is None:
            mismatched.append(p.id)
        else:
            ties.append({"prompt": p.id, "margin": margin})
    return {
        "checked": len(prompts),
        "identical": len(prompts) - len(ties) - len(mismatched),
        "float_ties": ties,
        "mismatched": mismatched,
    }


def lossless_rounds(prompts: list, rounds: list[dict], reference: dict, probs: dict, limit: float) -> dict:
    """:func:`lossless` of each round's outputs (prompt id -> tokens, of the prompts among
    ``prompts`` it holds), summed: a difference in any round is found, not only in the last."""
    total = {"checked": 0, "identical": 0, "float_ties": [], "mismatched": []}
    for outputs in rounds:
        check = lossless([p for p in prompts if p.id in outputs], outputs, reference, probs, limit)
        for key in total:
            total[key] += check[key]
    total["mismatched"] = sorted(set(total["mismatched"]))
    return total


def log_name(name: str) -> str:
    """A server log's file name for a configuration's name."""
    return "llama-server-" + name.replace(", ", "-").replace("=", "") + ".log"


def spent(before: dict, after: dict) -> dict:
    per_pos = [b - a for a, b in zip(before["num_accepted_tokens_per_pos"], after["num_accepted_tokens_per_pos"])]
    spent = {k: after[k] - before.get(k, 0.0) for k in after if k != "num_accepted_tokens_per_pos"}
    return {**spent, "num_accepted_tokens_per_pos": per_pos}


def _section(configs, rounds, outputs, counters, probs, prompts, target: Path, cfg) -> dict:
    """Medians over rounds; τ and per-position rates from the counters of every round pooled."""
    speeds = {name: [tokens / ms * 1000 if ms else 0.0 for tokens, ms in runs] for name, runs in rounds.items()}
    plain = statistics.median(speeds[PLAIN])
    reference = outputs[PLAIN][0]
    methods = {}
    for name in configs:
        if name == PLAIN:
            continue
        c = {k: sum(r.get(k, 0.0) for r in counters[name]) for k in ("num_drafts", "num_accepted_tokens")}
        c["num_accepted_tokens_per_pos"] = [
            sum(v) for v in zip(*(r["num_accepted_tokens_per_pos"] for r in counters[name]))
        ]
        drafts = c["num_drafts"]
        median = statistics.median(speeds[name])
        methods[name] = {
            "tau": 1 + c.get("num_accepted_tokens", 0.0) / drafts if drafts else 1.0,
            "per_position": [a / drafts for a in c["num_accepted_tokens_per_pos"]] if drafts else [],
            "tokens_per_s": median,
            "tokens_per_s_rounds": speeds[name],
            "speedup": median / plain if plain else None,
            "lossless": lossless_rounds(prompts, outputs[name], reference, probs, cfg.llamacpp_tie_margin),
        }
    drafted = [n for n in methods if is_drafted(n)]
    best = max(drafted, key=lambda n: methods[n]["tokens_per_s"])
    return {
        "engine": "llama.cpp",
        "target": str(target),
        "repeats": cfg.llamacpp_repeats,
        "plain": {"tokens_per_s": plain, "tokens_per_s_rounds": speeds[PLAIN]},
        "methods": methods,
        "best_draft": best,
    }
