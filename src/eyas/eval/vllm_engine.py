"""``eval.engine: vllm``: the export served by vLLM itself, its own counters beside eyas's τ.

eyas's in-process eval reads a drafter back in eyas's own conventions, so it cannot see an
export that a server misreads (layer ids shifted by one, a dtype the server changes). This
runs the same prompts, as token ids, through vLLM's offline ``LLM`` with the export as its
drafter, EAGLE-3 or DFlash (:func:`eyas.target.vllm_engine.speculative_decode`), and compares:

- τ: vLLM's ``1 + accepted / drafts`` against eyas's ``(tokens - 1) / passes`` per prompt,
  pooled. With identical outputs the two differ only in each prompt's last round: vLLM
  drafts ``k`` tokens even when fewer fit before ``max_tokens``, and counts drafts accepted
  past ``max_tokens`` or past the stop token, which eyas never drafts or commits. So vLLM's
  accepted count exceeds eyas's by at most ``k`` per prompt, and the check allows
  ``-TOLERANCE <= τ_vllm - τ_eyas <= TOLERANCE + k · prompts / passes``.
- verification passes: vLLM's draft count must equal eyas's pass count exactly (greedy);
- outputs: with temperature 0 vLLM's tokens must equal plain greedy decoding on every prompt.

At temperature > 0 the two engines draw different random numbers, so τ is reported side by
side without the check.
"""

from __future__ import annotations

from pathlib import Path

from eyas.config import RunConfig
from eyas.eval.report import report_frame


def method_name(family: str) -> str:
    """The report's row for the drafter as vLLM served it, beside eyas's own row ``family``."""
    return f"{family} (vllm)"


TOLERANCE = 0.02


def plain_vllm(result: dict, prompts: int) -> dict:
    """Speed of one vLLM run, in the shape of :func:`eyas.eval.report.plain_summary`."""
    tokens = sum(len(o) for o in result["outputs"])
    seconds = result["generate_seconds"]
    return {
        "prompts": prompts,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "engine": f"vllm {result['vllm_version']}",
        "result_file": result["result_file"],
    }


def summarize_vllm(result: dict, prompt_ids: list[str], k: int, reference: dict[str, list[int]] | None) -> dict:
    """vLLM's run in the shape of :func:`eyas.eval.report.summarize`, from vLLM's own counters."""
    counters = result["counters"]
    drafts, accepted = counters.get("num_drafts", 0), counters.get("num_accepted_tokens", 0)
    per_pos = counters.get("num_accepted_tokens_per_pos", [])
    # Positions past the drafter's draft length (a DFlash drafter's block size − 1) accept nothing.
    per_pos = [*per_pos, *[0] * (k - len(per_pos))]
    summary = {
        **plain_vllm(result, len(prompt_ids)),
        "target_passes": drafts,
        "tau": 1 + accepted / drafts if drafts else 1.0,
        "per_position": [a / drafts if drafts else 0.0 for a in per_pos],
        "tau_per_dataset": {},
        "tau_per_prompt": {},
        "speedup": None,
        "load_seconds": result["load_seconds"],
    }
    if reference is not None:
        mismatched = [pid for pid, out in zip(prompt_ids, result["outputs"], strict=True) if out != reference[pid]]
        summary["lossless"] = {
            "checked": len(prompt_ids),
            "identical": len(prompt_ids) - len(mismatched),
            "mismatched": mismatched,
        }
    return summary


def compare(eyas: dict, vllm: dict, k: int, greedy: bool) -> dict:
    """The agreement check between eyas's τ and vLLM's (see the module docstring)."""
    passes = eyas["target_passes"]
    allowed_above = TOLERANCE + (k * eyas["prompts"] / passes if passes else 0.0)
    difference = vllm["tau"] - eyas["tau"]
    check = {
        "eyas_tau": eyas["tau"],
        "vllm_tau": vllm["tau"],
        "difference": difference,
        "allowed": [-TOLERANCE, allowed_above],
        "eyas_passes": passes,
        "vllm_drafts": vllm["target_passes"],
        "problems": [],
    }
    if not greedy:
        check["checked"] = False
        return check
    check["checked"] = True
    if not -TOLERANCE <= difference <= allowed_above:
        check["problems"].append(
            f"τ differs: vLLM {vllm['tau']:.3f}, eyas {eyas['tau']:.3f} (allowed {-TOLERANCE:+.2f}..{allowed_above:+.3f}); "
            "likely cause: vLLM feeds the drafter other layers than eyas trained it on (eagle_aux_hidden_state_layer_ids "
            "in the export's config.json, read by vLLM as the state entering layer k = eyas's aux_layers + 1) or another dtype"
        )
    if passes != vllm["target_passes"]:
        check["problems"].append(
            f"verification passes differ: vLLM {vllm['target_passes']}, eyas {passes}; likely cause: the outputs differ "
            "(see lossless) or vLLM accepted other drafts than eyas for the same drafter"
        )
    mismatched = vllm.get("lossless", {}).get("mismatched")
    if mismatched:
        check["problems"].append(
            f"vLLM's greedy outputs differ from plain greedy decoding on {len(mismatched)} prompt(s); likely cause: a "
            "non-float32 dtype (near-ties flip in bf16) or a target directory vLLM reads differently from transformers"
        )
    return check


def run_in_vllm_only(
    config: RunConfig, draft_dir: Path, prompts: list, stop_ids: set[int], out_dir: Path, steps: int
) -> dict:
    """The report when only vLLM runs the target (``eval.in_process: false``).

    vLLM decodes every prompt twice, plain and with the drafter (drafting ``steps`` tokens a
    pass), in the dtype the target runs in on its devices. Plain decoding is the speed baseline
    and, greedy, the lossless reference: the drafter's outputs must equal it prompt by prompt, as
    they must equal eyas's own greedy decoding in-process.
    """
    from eyas.drafter.families import family_at
    from eyas.target import dtype_name
    from eyas.target.settings import SpeculativeDecoding
    from eyas.target.vllm_engine import speculative_decode

    cfg = config.eval
    ids, prompt_ids = [p.input_ids for p in prompts], [p.id for p in prompts]
    dtype, decoding = dtype_name(config.target), SpeculativeDecoding.from_config(cfg, steps)
    family = family_at(draft_dir)
    plain = speculative_decode(config.target, decoding, None, ids, stop_ids, dtype, out_dir)
    drafted = speculative_decode(config.target, decoding, draft_dir, ids, stop_ids, dtype, out_dir, family.vllm_method)
    baseline = plain_vllm(plain, len(prompts))
    reference = dict(zip(prompt_ids, plain["outputs"], strict=True)) if cfg.temperature == 0 else None
    method = summarize_vllm(drafted, prompt_ids, cfg.num_draft_tokens, reference)
    method["speedup"] = method["tokens_per_s"] / baseline["tokens_per_s"] if baseline["tokens_per_s"] else None
    return report_frame(config, draft_dir, prompts, baseline, {method_name(family.name): method})
