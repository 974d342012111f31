"""The on-disk form of hidden states: one safetensors file per shard, a sidecar, an index.

``shard-NNNNN.safetensors`` holds, concatenated over its samples in order:
``aux`` [tokens, 3H] (bfloat16, or with ``dtype: fp8`` float8 e4m3 plus float32 ``aux_scale``
[tokens, 3] — one scale per token and layer) and ``final`` [tokens, H] (always bfloat16: it is
the teacher's input, ``lm_head(final)``, so it is kept exact; shards of an older eyas may hold it
as e4m3 with a ``final_scale`` [tokens, 1], which the reader still dequantizes),
``input_ids`` int32 [tokens], ``loss_mask`` uint8 [tokens] and ``offsets`` int64 [samples+1];
its metadata (key ``eyas``) holds the format and the sample ids. A shard is written under a temporary name and renamed when
complete; then ``shard-NNNNN.json`` (checksum, counts) is written, last: a shard counts as done
only when its sidecar exists, so a killed run never mistakes a torn file for a finished one.
``index.json``, written when every shard is done, describes the whole set.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from eyas.files import atomic_path, write_json_atomic
from eyas.paths import HIDDEN_INDEX
from eyas.stage import StageError
from eyas.tensorfile import save_tensors

FORMAT = "eyas-hidden/1"
FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max


def shard_path(directory: Path, shard: int) -> Path:
    return directory / f"shard-{shard:05d}.safetensors"


def sidecar_path(directory: Path, shard: int) -> Path:
    return directory / f"shard-{shard:05d}.json"


def index_path(directory: Path) -> Path:
    return directory / HIDDEN_INDEX


def quantize(x: torch.Tensor, layers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 e4m3 with one float32 scale per token and layer: [T, layers·H] → (values, scales [T, layers])."""
    rows = x.float().reshape(x.shape[0], layers, -1)
    scale = rows.abs().amax(dim=-1).clamp(min=1e-12) / FP8_MAX
    return (rows / scale[..., None]).to(FP8).reshape(x.shape), scale


def dequantize(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    rows = values.float().reshape(values.shape[0], scale.shape[1], -1) * scale[..., None]
    return rows.reshape(values.shape).to(torch.bfloat16)


class ShardBuffer:
    """A shard assembled in preallocated tensors (no concatenation copy at the end).

    Zero-filled, and counting the samples stored, so that a sample an engine never returned is
    refused by :func:`write_shard` instead of being written as whatever the memory held.
    """

    def __init__(self, ids: list[str], lengths: list[int], hidden: int, num_aux: int, dtype: str):
        self.ids, self.dtype, self.num_aux = ids, dtype, num_aux
        self.puts = [0] * len(ids)
        """How many times each sample was stored: exactly once when the shard is complete."""
        total = sum(lengths)
        self.offsets = torch.zeros(len(lengths) + 1, dtype=torch.int64)
        self.offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
        storage = FP8 if dtype == "fp8" else torch.bfloat16
        self.tensors = {
            "aux": torch.zeros(total, num_aux * hidden, dtype=storage),
            "final": torch.zeros(total, hidden, dtype=torch.bfloat16),
            "input_ids": torch.zeros(total, dtype=torch.int32),
            "loss_mask": torch.zeros(total, dtype=torch.uint8),
            "offsets": self.offsets,
        }
        if dtype == "fp8":
            self.tensors["aux_scale"] = torch.zeros(total, num_aux, dtype=torch.float32)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def put(self, i: int, input_ids: list[int], loss_mask: list[int], aux: torch.Tensor, final: torch.Tensor) -> None:
        """Store sample ``i`` (aux [T, 3H], final [T, H] on any device); fp8 quantizes aux only."""
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        self.tensors["input_ids"][lo:hi] = torch.tensor(input_ids, dtype=torch.int32)
        self.tensors["loss_mask"][lo:hi] = torch.tensor(loss_mask, dtype=torch.uint8)
        if self.dtype == "fp8":
            aux, aux_scale = quantize(aux, self.num_aux)
            self.tensors["aux_scale"][lo:hi] = aux_scale.cpu()
        self.tensors["aux"][lo:hi] = aux.to(self.tensors["aux"].dtype).cpu()
        self.tensors["final"][lo:hi] = final.to(self.tensors["final"].dtype).cpu()
        self.puts[i] += 1

    def incomplete(self) -> str | None:
        """What keeps the shard from being written (samples never stored, or stored twice), or None."""
        problems = []
        for what, wrong in (("never stored", lambda n: n == 0), ("stored more than once", lambda n: n > 1)):
            ids = [self.ids[i] for i, n in enumerate(self.puts) if wrong(n)]
            if ids:
                listed = ", ".join(ids[:10]) + (", ..." if len(ids) > 10 else "")
                problems.append(f"{len(ids)} {what}: {listed}")
        return "; ".join(problems) or None


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def clock() -> tuple[float, float]:
    """Where a shard's work starts: wall and CPU clocks (:func:`write_shard`'s ``started``)."""
    return time.monotonic(), time.process_time()


def write_shard(directory: Path, shard: int, buffer: ShardBuffer, info: dict, started: tuple[float, float]) -> dict:
    """Write the shard atomically, then its sidecar; returns the sidecar's content.

    Refuses a shard whose every sample was not stored exactly once: its sidecar would mark it
    done. ``seconds`` and ``cpu_seconds`` in the sidecar run from ``started`` (:func:`clock`) to
    the shard being on disk, so the throughput they imply includes writing and checksumming; a
    resumed extraction counts the shards it keeps by them."""
    final_path = shard_path(directory, shard)
    problem = buffer.incomplete()
    if problem:
        raise StageError(f"{final_path}: not written, since not every sample was stored exactly once ({problem})")
    with atomic_path(final_path) as tmp:
        # One metadata key: safetensors writes several in hash order, and a redone shard should be byte-identical.
        save_tensors(buffer.tensors, tmp, metadata={"eyas": json.dumps({"format": FORMAT, "ids": buffer.ids})})
    sidecar = {
        "shard": shard,
        "file": final_path.name,
        "samples": len(buffer.ids),
        "tokens": buffer.num_tokens,
        "bytes": final_path.stat().st_size,
        "sha256": file_sha256(final_path),
        # With the size, how a later look tells the file unchanged without reading it (:func:`damaged`).
        "mtime_ns": final_path.stat().st_mtime_ns,
        **info,
        "seconds": round(time.monotonic() - started[0], 3),
        "cpu_seconds": round(time.process_time() - started[1], 3),
    }
    write_json_atomic(sidecar_path(directory, shard), sidecar)
    return sidecar


def damaged(directory: Path) -> list[str]:
    """The files index.json lists whose bytes are not those recorded when they were written:
    another size, or — only where the modification time moved, so an untouched shard is never
    read — another sha256. A shard read that way and found unchanged (copied without its times)
    gets its new time recorded in index.json, as git refreshes its index, so it is read once, not
    on every check. (A missing file is another matter: the stage's outputs are incomplete.)"""
    index = json.loads(index_path(directory).read_text())
    found, refreshed = [], False
    for shard in index["shards"]:
        path = directory / shard["file"]
        if not path.is_file():
            continue
        st = path.stat()
        if st.st_size != shard["bytes"]:
            found.append(shard["file"])
        elif "mtime_ns" in shard and shard["mtime_ns"] != st.st_mtime_ns:
            if file_sha256(path) != shard["sha256"]:
                found.append(shard["file"])
            else:
                shard["mtime_ns"], refreshed = st.st_mtime_ns, True
    if refreshed:
        write_json_atomic(index_path(directory), index)
    return found


def read_sidecar(directory: Path, shard: int) -> dict | None:
    """The sidecar of a finished shard, or None when the shard is not done."""
    path = sidecar_path(directory, shard)
    if not path.is_file() or not shard_path(directory, shard).is_file():
        return None
    return json.loads(path.read_text())


def remove_partial(directory: Path, shard: int) -> None:
    """Delete what a killed writer of this shard left: temp files, and a shard without sidecar."""
    for leftover in directory.glob(f"shard-{shard:05d}.*.tmp-*"):
        leftover.unlink(missing_ok=True)
    if not sidecar_path(directory, shard).is_file():
        shard_path(directory, shard).unlink(missing_ok=True)
