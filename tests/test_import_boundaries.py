"""The package layout is the pipeline: a stage reaches earlier stages only through their readers.

Stages import the ground floor (config, paths, records, files, figures, stage, console, jsonl,
tensorfile), the shared ``target``, ``drafter`` and ``speculate`` packages, and the modules
through which earlier stages hand over their records (``READERS``) — never another stage's
internals, and never a later stage. The shared packages import no stage at all; the ground
floor imports neither a stage nor a shared package. Only the top — ``cli``, ``pipeline``, ``demo`` —
sees every stage. Every import counts, including those inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "eyas"
STAGES = ("prompts", "generate", "tokenize", "merge", "extract", "train", "export", "eval")
READERS = {
    "prompts": {"eyas.prompts"},
    "generate": {"eyas.generate.store", "eyas.generate.expected"},
    "merge": {"eyas.merge.reader", "eyas.merge.stats"},
    "extract": {"eyas.extract.reader"},
}
"""Each stage's public way to read what it produced (generate's also what it will produce, for
planning space before it runs; tokenize's Parquet is read through merge;
merge's ``stats.json`` and its length histogram through ``merge.stats``)."""
SHARED = ("target", "drafter", "speculate")
SHARED_USES = {"drafter": {"target"}, "speculate": {"target", "drafter"}}
"""The shared packages built on others: the drafter on the target's sizes and layers, speculative
decoding on both."""
ADVISORS = ("tune", "scaling")
"""After the stages, the packages that answer what a trained drafter leaves open (how to serve it
here; what more data would buy). They rerun stages through each stage's package API (``eyas.eval.run``,
``eyas.train.CONTRACT``) and read through the readers and :data:`ADVISOR_READS`, never other internals;
no stage imports them."""
ADVISOR_READS = {
    "eyas.eval.llamacpp_engine",  # llama-server configurations, servers and the lossless check tune races
    "eyas.eval.prompts",  # the held-out prompts, as eval reads them
    "eyas.train.data",  # how many steps a run of n samples trains
    "eyas.merge.plan",  # which prompt a sample answers
    "eyas.generate.http.budget",  # what generation spent, from its ledger
}
TOP = ("cli", "pipeline", "demo", "__main__")
"""Top-level modules that assemble the stages; every other top-level module is the ground floor."""


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {n for n in names if n.startswith("eyas.")}


def owner(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES + SHARED + ADVISORS else None


def package_api(name: str, package: str) -> bool:
    """``eyas.train`` or a member of its ``__init__`` (``eyas.train.CONTRACT``), not a module inside it."""
    parts = name.split(".")
    return len(parts) == 2 or (
        len(parts) == 3 and not ((SRC / package / f"{parts[2]}.py").exists() or (SRC / package / parts[2]).is_dir())
    )


def allowed(package: str, name: str) -> bool:
    other = owner(name)
    if package in ADVISORS and other in STAGES:
        read = any(name == r or name.startswith(r + ".") for r in READERS.get(other, set()) | ADVISOR_READS)
        return read or package_api(name, other)
    if other is None or other == package or (package in STAGES + ADVISORS and other in SHARED):
        return True
    if other in SHARED_USES.get(package, ()):
        return True
    earlier = package in STAGES and other in STAGES and STAGES.index(other) < STAGES.index(package)
    # `from eyas.merge.reader import iter_split` names the reader and one of its members.
    return earlier and any(name == r or name.startswith(r + ".") for r in READERS.get(other, ()))


def violations() -> list[str]:
    packaged = [
        f"{path.relative_to(SRC)} imports {name}"
        for package in STAGES + SHARED + ADVISORS
        for path in sorted((SRC / package).rglob("*.py"))
        for name in sorted(imports(path))
        if not allowed(package, name)
    ]
    ground = [
        f"{path.relative_to(SRC)} imports {name}"
        for path in sorted(SRC.glob("*.py"))
        if path.stem not in TOP
        for name in sorted(imports(path))
        if owner(name) is not None
    ]
    return packaged + ground


def test_stages_reach_earlier_stages_only_through_their_readers():
    assert violations() == []


def test_the_check_sees_a_forbidden_import(tmp_path, monkeypatch):
    """The walk is real: an eval module importing train's internals is reported."""
    fake = tmp_path / "eyas"
    for package in STAGES + SHARED + ADVISORS:
        (fake / package).mkdir(parents=True)
    (fake / "train" / "loop.py").write_text("")
    (fake / "tune" / "bad.py").write_text("from eyas.train.loop import train\nfrom eyas import eval\n")
    (fake / "eval" / "bad.py").write_text("def f():\n    from eyas.train.loop import train\n")
    (fake / "eval" / "good.py").write_text(
        "from eyas.merge.reader import iter_split\nfrom eyas.drafter.families import load_drafter\n"
    )
    (fake / "target" / "bad.py").write_text("import eyas.extract.reader\n")
    (fake / "paths.py").write_text("def f():\n    import eyas.target\n")
    (fake / "cli.py").write_text("import eyas.train.loop\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["SRC"]), "SRC", fake)
    assert violations() == [
        "eval/bad.py imports eyas.train.loop",
        "eval/bad.py imports eyas.train.loop.train",
        "target/bad.py imports eyas.extract.reader",
        "tune/bad.py imports eyas.train.loop",
        "tune/bad.py imports eyas.train.loop.train",
        "paths.py imports eyas.target",
    ]
