"""Random access by sample to extracted hidden states, memory-mapped.

``HiddenStates(run_dir / "hidden")[i]`` is sample ``i`` of the merged train split: its ids,
loss mask, aux states [T, 3H] and final states [T, H] in bfloat16 (fp8 shards store aux as
e4m3, dequantized on read, and final as exact bfloat16; a ``final_scale`` tensor, written by
older eyas versions that quantized final too, is honoured per shard). Shards are opened
lazily with safetensors' memory map, so a reader costs no RAM up front, and each training
rank can read only its own shards (:meth:`HiddenStates.shard_ranges`). Safe to hand to
DataLoader workers: open files are not pickled, each worker opens its own.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from eyas.extract import storage
from eyas.stage import StageError


@dataclass
class HiddenSample:
    id: str
    input_ids: torch.Tensor
    """LongTensor [T]."""
    loss_mask: torch.Tensor
    """uint8 [T]: 1 where the token is trained on."""
    aux: torch.Tensor
    """bfloat16 [T, 3H]: the aux layers' outputs, in ``aux_layers`` order."""
    final: torch.Tensor
    """bfloat16 [T, H]: after the final norm, so target logits are ``lm_head(final)``."""


class _Shard:
    def __init__(self, path: Path):
        self.file = safe_open(str(path), framework="pt")
        self.ids: list[str] = json.loads(self.file.metadata()["eyas"])["ids"]
        self.offsets = self.file.get_tensor("offsets").tolist()
        self.final_scaled = "final_scale" in self.file.keys()
        """An older eyas's fp8 shard: final is e4m3 with a per-token scale too."""
        self.verified = False
        """Whether its bytes were checked against index.json, as they are before any state of it is read."""

    def rows(self, name: str, lo: int, hi: int) -> torch.Tensor:
        return self.file.get_slice(name)[lo:hi]


class HiddenStates:
    def __init__(self, hidden_dir: Path | str):
        self.hidden_dir = Path(hidden_dir)
        index = storage.index_path(self.hidden_dir)
        if not index.is_file():
            raise StageError(f"{index}: missing; run `eyas extract CONFIG` (an interrupted run resumes)")
        self.index = json.loads(index.read_text())
        if self.index.get("format") != storage.FORMAT:
            raise StageError(f"{index}: format {self.index.get('format')!r} is not {storage.FORMAT!r}")
        self._starts = [s["sample_start"] for s in self.index["shards"]]
        self._open: dict[int, _Shard] = {}

    def __len__(self) -> int:
        return self.index["num_samples"]

    @property
    def aux_layers(self) -> list[int]:
        """0-based decoder layers whose outputs make up ``aux`` (HF index = layer + 1)."""
        return list(self.index["aux_layers"])

    @property
    def hidden_size(self) -> int:
        return self.index["hidden_size"]

    @property
    def dtype(self) -> str:
        """Storage dtype: ``bf16`` or ``fp8`` (reads are bfloat16 either way)."""
        return self.index["dtype"]

    def ids(self) -> list[str]:
        """Every sample's id, in order (each shard's metadata, no tensor read)."""
        return [sample_id for shard in range(len(self.index["shards"])) for sample_id in self._shard(shard).ids]

    def shard_ranges(self) -> list[range]:
        """Sample indices of each shard, in order."""
        return [range(s["sample_start"], s["sample_start"] + s["samples"]) for s in self.index["shards"]]

    def _shard(self, shard: int) -> _Shard:
        if shard not in self._open:
            self._open[shard] = _Shard(self.hidden_dir / self.index["shards"][shard]["file"])
        return self._open[shard]

    def __getitem__(self, i: int) -> HiddenSample:
        if not -len(self) <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} samples")
        i %= len(self)
        shard = bisect.bisect_right(self._starts, i) - 1
        f = self._shard(shard)
        if not f.verified:
            self._verify(shard)
            f.verified = True
        local = i - self._starts[shard]
        lo, hi = f.offsets[local], f.offsets[local + 1]
        aux, final = f.rows("aux", lo, hi), f.rows("final", lo, hi)
        if self.dtype == "fp8":
            aux = storage.dequantize(aux, f.rows("aux_scale", lo, hi))
        if f.final_scaled:
            final = storage.dequantize(final, f.rows("final_scale", lo, hi))
        return HiddenSample(
            id=f.ids[local],
            input_ids=f.rows("input_ids", lo, hi).long(),
            loss_mask=f.rows("loss_mask", lo, hi),
            aux=aux,
            final=final,
        )

    def _verify(self, shard: int) -> None:
        """Refuse a shard whose bytes are not those extract recorded: corrupt states are never trained on."""
        entry = self.index["shards"][shard]
        path = self.hidden_dir / entry["file"]
        if storage.file_sha256(path) != entry["sha256"]:
            raise StageError(
                f"{path}: its bytes are not those extract wrote (sha256 differs from {storage.index_path(self.hidden_dir)}: "
                "corrupted on disk, or written since); `eyas run CONFIG` or `eyas extract CONFIG` redoes this shard alone"
            )

    def verify(self) -> list[str]:
        """Shard files whose checksum differs from index.json (reads every byte)."""
        return [
            s["file"] for s in self.index["shards"] if storage.file_sha256(self.hidden_dir / s["file"]) != s["sha256"]
        ]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_open": {}}
