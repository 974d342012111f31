"""The families verdict: ship the fastest lossless family only when it beats plain decoding and the
draftless speculation measured beside it; otherwise say to ship none. ``families.json`` records
which evaluations it compared."""

import yaml

from eyas.config import load_config
from eyas.eval.families import compare, families_state, report_families
from eyas.files import write_json_atomic
from eyas.paths import RunPaths
from eyas.stage import MARKER_FORMAT

CLEAN = {"checked": 2, "identical": 2, "float_ties": [], "mismatched": []}


def in_process(family: str, speedup: float | None, lookup: float = 0.9) -> dict:
    methods = {
        family: {"tau": 1.5, "per_position": [0.5], "speedup": speedup, "lossless": CLEAN},
        "prompt_lookup": {"tau": 1.1, "per_position": [0.1], "speedup": lookup, "lossless": CLEAN},
    }
    return {"methods": methods, "prompts": 2, "draft": f"/{family}"}


def in_llamacpp(family: str, speedup: float | None, ngram: float) -> dict:
    report = in_process(family, 1.0)
    report["llamacpp"] = {
        "methods": {
            f"{family}, n=1": {"tau": 1.4, "speedup": speedup, "lossless": CLEAN},
            "ngram-mod": {"tau": 1.2, "speedup": ngram, "lossless": CLEAN},
        },
        "best_draft": f"{family}, n=1",
    }
    return report


def test_the_fastest_family_is_shipped_only_when_it_beats_plain_and_the_draftless_methods():
    shipped = compare({"eagle3": in_llamacpp("eagle3", 1.2, 1.05), "dflash": in_llamacpp("dflash", 0.9, 1.0)})
    assert shipped["faster"] == "eagle3" and shipped["verdict"].startswith("faster on these prompts: eagle3, 1.20×")

    slower = compare({"eagle3": in_process("eagle3", 0.86), "dflash": in_process("dflash", 0.7)})
    assert slower["best"] == "eagle3" and slower["faster"] is None
    assert slower["verdict"].startswith("ship no drafter: no family decodes faster than plain decoding")

    ngram = compare({"eagle3": in_llamacpp("eagle3", 1.05, 1.1), "dflash": in_llamacpp("dflash", 0.9, 1.08)})
    assert ngram["faster"] is None and ngram["draftless"] == {"ngram-mod": 1.1}
    assert "than ngram-mod (1.10×, no drafter)" in ngram["verdict"]


def test_a_family_without_a_measured_speed_is_shown_not_raised_on():
    summary = compare({"eagle3": in_process("eagle3", None), "dflash": in_process("dflash", 1.3, lookup=1.0)})
    assert summary["faster"] == "dflash" and "eagle3 not measured" in summary["verdict"]
    none = compare({"eagle3": in_process("eagle3", None), "dflash": in_process("dflash", None)})
    assert none["faster"] is None and none["verdict"].startswith("no drafter family decoded losslessly")


def test_families_json_is_stale_once_a_family_is_evaluated_again(tmp_path):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"run_dir": "run", "train": {"drafter": ["eagle3", "dflash"]}}))
    config = load_config(tmp_path / "run.yaml")
    assert families_state(config).status == "missing"
    views = {view.train.drafter: RunPaths.of(view) for view in config.drafter_views()}

    def evaluated(family: str, fingerprint: dict) -> None:
        marker = {"stage": "eval", "format": MARKER_FORMAT, "fingerprint": fingerprint, "inputs": {}}
        write_json_atomic(views[family].marker("eval"), marker)

    evaluated("eagle3", {"eval.max_new_tokens": 64})
    evaluated("dflash", {"eval.max_new_tokens": 64})
    report_families(config, {"eagle3": in_process("eagle3", 1.2), "dflash": in_process("dflash", 1.1)}, quiet=True)
    assert families_state(config).status == "current"
    evaluated("dflash", {"eval.max_new_tokens": 32})
    state = families_state(config)
    assert state.status == "stale" and state.why == "eval (dflash) was redone since the comparison"
