"""The target in llama.cpp, the engine CPU users serve with: its converter, and ``llama-server``.

eyas uses a llama.cpp source tree with ``llama-server`` built in it (``make llamacpp`` builds
the pinned release into ``.llamacpp/llama.cpp``; ``target.llamacpp`` or ``$EYAS_LLAMACPP``
name another). Two things come from it, both run as child processes, never linked:

- ``convert_hf_to_gguf.py`` with the tree's own ``gguf-py`` (a PyPI ``gguf`` may be older than
  the tree and lack EAGLE-3): Hugging Face directories — targets and eyas's exported drafters —
  to GGUF files (:func:`convert`);
- ``llama-server`` on loopback, on a free port, in a process group of its own that dies with
  eyas (:class:`LlamaServer`): greedy completions of token ids, with llama.cpp's own timings
  and speculative-decoding counters.

Converted files are cached in ``$EYAS_CACHE/gguf/`` under a name made of what they were made
from: the content of the Hugging Face directory (a hub target's commit), the converter's own
files and the GGUF type (and, for a drafter, its target's). Two targets in folders of the same
name, a target retrained in place, another precision or another converter each get a file of
their own; the same drafter converted by ``eyas export --format gguf`` and by ``eyas eval
--engine llamacpp`` is one file (:func:`target_ggufs`, :func:`draft_gguf`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from eyas.config import ConfigError, TargetConfig
from eyas.files import write_json_atomic
from eyas.records import content_hash
from eyas.stage import file_digest
from eyas.target.cache import use
from eyas.target.children import log_tail, start_child, stop_group

ENV_LLAMACPP = "EYAS_LLAMACPP"
CHECKOUT_TREE = Path(__file__).resolve().parents[3] / ".llamacpp" / "llama.cpp"
"""Where ``make llamacpp`` builds llama.cpp when eyas runs from a checkout."""
SERVER = Path("build") / "bin" / "llama-server"
GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
"""The GGUF type of a drafter or target in a dtype, as the converter's ``--outtype`` names it."""


class LlamaCppError(RuntimeError):
    """llama.cpp's converter or server failed; the message names its log."""


@dataclass(frozen=True)
class LlamaCpp:
    """A llama.cpp source tree with ``llama-server`` built in ``build/bin``."""

    tree: Path

    @property
    def server(self) -> Path:
        return self.tree / SERVER

    @property
    def converter(self) -> Path:
        return self.tree / "convert_hf_to_gguf.py"

    def converter_identity(self) -> str:
        """The converter by content: its script and the ``gguf-py`` it runs with (another pin or
        a patched converter writes other files)."""
        return _files_digest([self.converter, *sorted((self.tree / "gguf-py").rglob("*.py"))], self.tree)

    def build_identity(self) -> str:
        """The server by content: ``llama-server`` and the shared libraries built beside it (another
        pin or other build flags decode at another speed)."""
        built = self.server.parent
        libraries = sorted(p for p in built.iterdir() if ".so" in p.name or p.suffix == ".dylib")
        return _files_digest([self.server, *libraries], built)


def _files_digest(files: list[Path], root: Path, digest=file_digest) -> str:
    return content_hash({str(p.relative_to(root)): digest(p) for p in files if p.is_file()})


def source_digest(directory: Path) -> str:
    """A Hugging Face directory by what the converter reads from it: every top-level file but
    Markdown (a README changes no tensor), so the same drafter in two export folders is one.
    Each file is read once per change of its size, modification time or inode
    (:func:`stat_digest`): a local target's weights are GBs, and every export, eval and tune
    call asks."""
    return _files_digest(sorted(p for p in directory.iterdir() if p.suffix != ".md"), directory, stat_digest)


DIGESTS_FILE = "digests.json"
"""In ``$EYAS_CACHE``: path -> [size, mtime_ns, inode, sha256] of the files :func:`stat_digest` read."""


def stat_digest(path: Path) -> str:
    """``path``'s sha256, read again only when its size, modification time or inode changed
    since it was last read (as git's index and ccache decide a file is unchanged): writing a
    file, copying one over it or retraining in place changes them."""
    from eyas.target import cache_root

    cache = cache_root() / DIGESTS_FILE
    try:
        known = json.loads(cache.read_text()) if cache.is_file() else {}
    except ValueError:  # a cache torn by a crash is rebuilt, never trusted
        known = {}
    st = path.stat()
    key, stamp = str(path.resolve()), [st.st_size, st.st_mtime_ns, st.st_ino]
    entry = known.get(key)
    if isinstance(entry, list) and entry[:3] == stamp:
        return entry[3]
    sha = file_digest(path)
    known[key] = [*stamp, sha]
    cache.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(cache, known)
    return sha


def find_llamacpp(configured: str | None) -> LlamaCpp:
    """``target.llamacpp``, ``$EYAS_LLAMACPP``, or the checkout's ``.llamacpp/llama.cpp``."""
    for candidate, source in ((configured, "target.llamacpp"), (os.environ.get(ENV_LLAMACPP), ENV_LLAMACPP)):
        if candidate:
            found = LlamaCpp(Path(candidate).expanduser().absolute())
            missing = [p for p in (found.server, found.converter) if not p.is_file()]
            if missing:
                raise ConfigError(f"{source}: {candidate} is not a built llama.cpp tree ({missing[0]} is missing)")
            return found
    if (CHECKOUT_TREE / SERVER).is_file():
        return LlamaCpp(CHECKOUT_TREE)
    raise ConfigError(
        "llama.cpp is not built: run `make llamacpp` (the pinned release, into .llamacpp/), or point "
        "target.llamacpp / $EYAS_LLAMACPP at a llama.cpp tree with llama-server built in build/bin"
    )


def convert(llamacpp: LlamaCpp, model_dir: Path, out: Path, outtype: str, target_dir: Path | None = None) -> Path:
    """``model_dir`` (a Hugging Face directory) as a GGUF file of ``outtype`` (``f32``, ``f16``,
    ``bf16``, ``q8_0``) at ``out``, by llama.cpp's own converter; a drafter needs its target's
    directory (``target_dir``: tokenizer, vocabulary size, layer count). Written aside and renamed,
    so ``out`` is complete or absent; the converter's log is ``out`` + ``.log``."""
    tmp = out.with_name(out.name + ".tmp")
    log_path = out.with_name(out.name + ".log")
    command = [sys.executable, str(llamacpp.converter), str(model_dir), "--outtype", outtype, "--outfile", str(tmp)]
    if target_dir is not None:
        command += ["--target-model-dir", str(target_dir)]
    pythonpath = os.pathsep.join(filter(None, [str(llamacpp.tree / "gguf-py"), os.environ.get("PYTHONPATH")]))
    out.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log_file:
        done = subprocess.run(
            command, stdout=log_file, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONPATH=pythonpath)
        )
    if done.returncode != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise LlamaCppError(
            f"llama.cpp's converter failed on {model_dir} (exit {done.returncode}); last lines of {log_path}:\n"
            f"{log_tail(log_path)}"
        )
    os.replace(tmp, out)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """One ``llama-server`` on loopback, started with ``args`` (model, draft, speculation type...).

    The constructor returns once the server answers ``/health``; every request and the start are
    bounded by ``timeout_s``. A context manager that stops the server and its group on exit.
    """

    def __init__(self, llamacpp: LlamaCpp, args: list[str], log_path: Path, timeout_s: float, threads: int):
        self.log_path, self.timeout_s = log_path, timeout_s
        self.url = f"http://127.0.0.1:{_free_port()}"
        port = self.url.rsplit(":", 1)[1]
        argv = [str(llamacpp.server), "--host", "127.0.0.1", "--port", port, "--metrics", "-t", str(threads), *args]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("w") as log_file:
            self._process = start_child(argv, log_file)
        try:
            self._wait_until_ready()
        except BaseException:
            self.close()
            raise

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise LlamaCppError(
                    f"llama-server exited with {self._process.returncode}; last lines of {self.log_path}:\n"
                    f"{log_tail(self.log_path)}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise LlamaCppError(
            f"llama-server did not start within target.engine_timeout_s = {self.timeout_s:g} s; last lines of "
            f"{self.log_path}:\n{log_tail(self.log_path)}"
        )

    def complete(self, prompt: list[int], max_tokens: int, cache_prompt: bool = False, n_probs: int = 0) -> dict:
        """Greedy decoding of ``max_tokens`` at most after the token ids ``prompt``, the prompt
        processed anew unless ``cache_prompt`` (then only what the last request did not share):
        llama.cpp's answer, with ``tokens`` and ``timings``; with ``n_probs``, also each decoded
        token's ``n_probs`` most likely tokens before sampling (``completion_probabilities``, each
        with ``top_logprobs``: ``id`` and ``logprob``)."""
        request = {
            "prompt": prompt,
            "n_predict": max_tokens,
            "temperature": 0.0,
            "top_k": 1,
            "cache_prompt": cache_prompt,
            "return_tokens": True,
            "n_probs": n_probs,
        }
        body = json.dumps(request).encode()
        http = urllib.request.Request(self.url + "/completion", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(http, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            raise LlamaCppError(
                f"llama-server failed a completion ({e}); last lines of {self.log_path}:\n{log_tail(self.log_path)}"
            ) from None

    def counters(self) -> dict[str, float]:
        """llama.cpp's own speculative-decoding counters (``/metrics``, totals since start) by short
        name: ``num_drafts`` (verification steps), ``num_draft_tokens``, ``num_accepted_tokens``,
        ``num_accepted_tokens_per_pos`` (a list)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=self.timeout_s) as response:
            text = response.read().decode()
        counters: dict = {"num_accepted_tokens_per_pos": []}
        prefix = "llamacpp:spec_decode_"
        for line in text.splitlines():
            if not line.startswith(prefix):
                continue
            name, value = line[len(prefix) :].rsplit(" ", 1)
            if name.startswith("num_accepted_tokens_per_pos_total"):
                counters["num_accepted_tokens_per_pos"].append(float(value))
            else:
                counters[name.removesuffix("_total")] = float(value)
        return counters

    def close(self) -> None:
        stop_group(self._process)

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass(frozen=True)
class TargetGgufs:
    """The target as llama.cpp loads it."""

    hf_dir: Path
    """Its Hugging Face directory (what the converter reads for a drafter's tokenizer and sizes)."""
    same_precision: Path
    """Converted from ``hf_dir`` in the drafter's precision, once per content, into ``$EYAS_CACHE/gguf/``."""
    outtype: str
    """That precision, as the converter's ``--outtype`` names it: its drafter is converted to it too."""
    shipped: Path | None
    """The GGUF file the target ships as, when it ships as one (the embedded Q4_1)."""


def target_ggufs(target: TargetConfig, llamacpp: LlamaCpp, outtype: str) -> TargetGgufs:
    """The target converted to ``outtype``, keyed by its content: a local directory's files (read
    on every call: a target retrained in place is converted again), a hub target's commit."""
    from eyas.config import EMBEDDED_TARGET
    from eyas.target import cache_root, embedded_gguf, resolve_target

    source = resolve_target(target)
    if source.is_local:
        hf_dir = Path(source.name_or_path)
        name, content = hf_dir.name, source_digest(hf_dir)
    else:
        from huggingface_hub import snapshot_download

        hf_dir = Path(snapshot_download(source.name_or_path, revision=source.revision))
        # A snapshot's folder is its commit, which fixes every file in it.
        name, content = source.name_or_path.replace("/", "--"), f"{source.name_or_path}@{hf_dir.name}"
    key = content_hash({"target": content, "converter": llamacpp.converter_identity(), "outtype": outtype})
    converted = cache_root() / "gguf" / f"{name}-{key[:16]}-{outtype}.gguf"
    if not converted.is_file():
        convert(llamacpp, hf_dir, converted, outtype)
    use(converted, cache_root())
    if target.model == EMBEDDED_TARGET:
        shipped = embedded_gguf()
    else:
        shipped = Path(target.model).expanduser() if target.model.endswith(".gguf") else None
    return TargetGgufs(hf_dir, converted, outtype, shipped)


def draft_gguf(llamacpp: LlamaCpp, drafter_dir: Path, target: TargetGgufs, outtype: str | None = None) -> Path:
    """The drafter in ``drafter_dir`` (a Hugging Face layout) converted beside ``target`` into
    ``$EYAS_CACHE/gguf/``, in ``outtype`` (one of :data:`eyas.config.DraftGgufType`; None: the
    target's precision): keyed by the drafter's content, the target file (the converter reads the target's
    tokenizer and sizes) and the converter, so ``eyas export --format gguf``, ``eyas eval --engine
    llamacpp`` and ``eyas tune`` of one drafter in one type serve one file."""
    from eyas.target import cache_root

    key = content_hash(
        {
            "draft": source_digest(drafter_dir),
            "target": target.same_precision.name,
            "converter": llamacpp.converter_identity(),
        }
    )
    outtype = outtype or target.outtype
    converted = cache_root() / "gguf" / f"draft-{key[:16]}-{outtype}.gguf"
    if not converted.is_file():
        convert(llamacpp, drafter_dir, converted, outtype, target_dir=target.hf_dir)
    return use(converted, cache_root())
