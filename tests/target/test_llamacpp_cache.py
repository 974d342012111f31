"""llama.cpp's converted files and builds are known by content, never by name. A stand-in llama.cpp
tree — its converter writes, as the "GGUF" file, what it read; its server never runs — shows
which conversions are made again, in seconds and without the real build."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from eyas.config import TargetConfig
from eyas.target.llamacpp import LlamaCpp, target_ggufs

ROOT = Path(__file__).resolve().parents[2]
CONVERTER = """import json, sys
from pathlib import Path
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1] if flag in args else None
read = {p.name: p.read_text() for p in sorted(Path(args[0]).iterdir()) if p.suffix == ".json"}
out = {"converter": VERSION, "read": read, "outtype": value("--outtype"), "target": value("--target-model-dir")}
Path(value("--outfile")).write_text(json.dumps(out))
"""


def stand_in_llamacpp(tree: Path, version: str = "1") -> LlamaCpp:
    """A llama.cpp tree whose converter writes, as the "GGUF", what it read and its own ``version``."""
    (tree / "gguf-py" / "gguf").mkdir(parents=True, exist_ok=True)
    (tree / "gguf-py" / "gguf" / "__init__.py").write_text("")
    (tree / "convert_hf_to_gguf.py").write_text(f"VERSION = {version!r}\n{CONVERTER}")
    (tree / "build" / "bin").mkdir(parents=True, exist_ok=True)
    (tree / "build" / "bin" / "llama-server").write_text("a build")
    return LlamaCpp(tree)


def hf_dir(path: Path, text: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"text": text}))
    return path


def converted(path: Path) -> dict:
    return json.loads(path.read_text())


def test_a_target_gguf_is_the_conversion_of_that_targets_content_by_that_converter(tmp_path, monkeypatch):
    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    llamacpp = stand_in_llamacpp(tmp_path / "llama.cpp")
    a, b = hf_dir(tmp_path / "a" / "model", "a"), hf_dir(tmp_path / "b" / "model", "b")
    # Two targets in folders of the same name.
    first = target_ggufs(TargetConfig(model=str(a)), llamacpp, "f32").same_precision
    assert converted(first)["read"]["config.json"] == '{"text": "a"}'
    other = target_ggufs(TargetConfig(model=str(b)), llamacpp, "f32").same_precision
    assert other != first and converted(other)["read"]["config.json"] == '{"text": "b"}'
    # A target retrained in place.
    hf_dir(a, "a, retrained")
    again = target_ggufs(TargetConfig(model=str(a)), llamacpp, "f32").same_precision
    assert converted(again)["read"]["config.json"] == '{"text": "a, retrained"}'
    # Another converter, and another precision.
    newer = target_ggufs(TargetConfig(model=str(a)), stand_in_llamacpp(tmp_path / "llama.cpp-2", "2"), "f32")
    assert converted(newer.same_precision)["converter"] == "2"
    assert converted(target_ggufs(TargetConfig(model=str(a)), llamacpp, "bf16").same_precision)["outtype"] == "bf16"
    # The same content, converter and precision: the file already made, not a conversion.
    assert target_ggufs(TargetConfig(model=str(a)), llamacpp, "f32").same_precision == again
    assert len(list((tmp_path / "cache" / "gguf").glob("*.gguf"))) == 5


def test_a_draft_gguf_is_keyed_by_the_drafters_content_its_targets_file_and_the_converter(tmp_path, monkeypatch):
    from eyas.target.llamacpp import draft_gguf

    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    llamacpp = stand_in_llamacpp(tmp_path / "llama.cpp")
    f32 = target_ggufs(TargetConfig(model=str(hf_dir(tmp_path / "target", "t"))), llamacpp, "f32")
    bf16 = target_ggufs(TargetConfig(model=str(hf_dir(tmp_path / "target", "t"))), llamacpp, "bf16")
    export = hf_dir(tmp_path / "export" / "sglang", "drafter")
    (export / "README.md").write_text("how to serve it")
    draft = draft_gguf(llamacpp, export, f32)
    assert converted(draft)["outtype"] == "f32" and converted(draft)["target"] == str(f32.hf_dir)
    # The same drafter in another folder, without its README: one file (export and eval share it).
    assert draft_gguf(llamacpp, hf_dir(tmp_path / "tmp" / "hf", "drafter"), f32) == draft
    assert converted(draft_gguf(llamacpp, export, bf16))["outtype"] == "bf16"
    hf_dir(export, "drafter, retrained")
    assert converted(draft_gguf(llamacpp, export, f32))["read"]["config.json"] == '{"text": "drafter, retrained"}'


def test_a_build_is_known_by_its_server_and_libraries(tmp_path):
    llamacpp = stand_in_llamacpp(tmp_path / "llama.cpp")
    built = llamacpp.build_identity()
    assert llamacpp.build_identity() == built
    (llamacpp.server.parent / "libggml-cpu.so").write_text("a backend")
    with_library = llamacpp.build_identity()
    (llamacpp.server.parent / "libggml-cpu.so").write_text("another backend")
    assert len({built, with_library, llamacpp.build_identity()}) == 3


def _make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args], capture_output=True, text=True)


def test_changing_the_llamacpp_pin_rebuilds_it(tmp_path):
    """A build stamped as ``make llamacpp`` stamps it is up to date, until the pinned source changes."""
    tree = f"LLAMACPP={tmp_path}"
    # The recipe's last line writes the stamp; run it alone, as a finished build would have.
    stamp_line = _make("-n", tree, "llamacpp").stdout.strip().splitlines()[-1]
    subprocess.run(stamp_line, shell=True, check=True, cwd=ROOT)
    assert _make("-q", tree, "llamacpp").returncode == 0
    assert _make("-q", tree, f"LLAMACPP_SHA256={'1' * 64}", "llamacpp").returncode == 1


def test_a_targets_files_are_read_again_only_when_their_stat_changes(tmp_path, monkeypatch):
    """Every export, eval and tune call hashed each weight file of a local target (GBs at real
    sizes); a file is now known unchanged by its size, modification time and inode, as git's
    index knows it, and read again when one of them changes."""
    import os

    from eyas.target.llamacpp import source_digest

    monkeypatch.setenv("EYAS_CACHE", str(tmp_path / "cache"))
    target = hf_dir(tmp_path / "target", "weights A")
    weights = target / "config.json"
    first = source_digest(target)
    stamp = weights.stat()
    weights.write_text(json.dumps({"text": "weights B"}))  # same size
    os.utime(weights, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert source_digest(target) == first, "unchanged stat: the digest recorded, not a second read"
    os.utime(weights, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1))
    assert source_digest(target) != first, "a new modification time: read again"
    (tmp_path / "cache" / "digests.json").write_text("{torn")
    assert source_digest(target) != first, "a torn cache is rebuilt, never trusted"


def test_the_cache_keeps_to_its_limit_by_removing_what_was_used_longest_ago(tmp_path, monkeypatch):
    """Every drafter trained and target tried left a GGUF file in $EYAS_CACHE, without bound."""
    import os

    from eyas.target.cache import LIMIT_ENV, size, use

    root = tmp_path / "cache"
    (root / "gguf").mkdir(parents=True)
    files = []
    for i, when in enumerate((100, 300, 200)):
        f = root / "gguf" / f"draft-{i}.gguf"
        f.write_bytes(b"x" * 1000)
        (root / "gguf" / f"draft-{i}.gguf.log").write_text("converted")
        os.utime(f, (when, when))
        files.append(f)
    monkeypatch.setenv(LIMIT_ENV, str(2500 / 1e9))
    new = root / "gguf" / "draft-new.gguf"
    new.write_bytes(b"y" * 1000)
    assert use(new, root) == new
    # Over 2,500 bytes with four 1,000-byte files (and their logs): the two used longest ago go.
    assert sorted(p.name for p in (root / "gguf").glob("*.gguf")) == ["draft-1.gguf", "draft-new.gguf"]
    assert not (root / "gguf" / "draft-0.gguf.log").exists() and size(root) <= 2500
    use(files[1], root)  # reused: now the newest, and never removed by its own use
    assert files[1].is_file()
