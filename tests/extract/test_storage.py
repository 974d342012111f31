"""A shard is written only complete: every sample stored exactly once, nothing left as stale memory."""

from __future__ import annotations

import pytest
import torch

from eyas.extract import storage
from eyas.stage import StageError

H, LENGTHS = 4, [2, 3, 1]


def buffer(dtype: str = "bf16") -> storage.ShardBuffer:
    return storage.ShardBuffer(["a", "b", "c"], LENGTHS, H, 3, dtype)


def put(shard: storage.ShardBuffer, i: int) -> None:
    n = LENGTHS[i]
    shard.put(i, [7] * n, [1] * n, torch.ones(n, 3 * H), torch.ones(n, H))


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_a_new_buffer_holds_zeros(dtype):
    assert all(not t.float().any() for name, t in buffer(dtype).tensors.items() if name != "offsets")


def test_a_shard_missing_a_sample_is_refused_naming_the_shard_and_the_sample(tmp_path):
    shard = buffer()
    put(shard, 0)
    put(shard, 2)
    with pytest.raises(StageError, match=r"shard-00003.safetensors: not written, .*\(1 never stored: b\)"):
        storage.write_shard(tmp_path, 3, shard, {}, storage.clock())
    assert list(tmp_path.iterdir()) == [], "neither the shard nor its sidecar"


def test_a_sample_stored_twice_is_refused(tmp_path):
    shard = buffer()
    for i in (0, 1, 1, 2):
        put(shard, i)
    with pytest.raises(StageError, match=r"1 stored more than once: b"):
        storage.write_shard(tmp_path, 0, shard, {}, storage.clock())


def test_a_complete_shard_is_written_with_its_sidecar(tmp_path):
    shard = buffer()
    for i in range(3):
        put(shard, i)
    sidecar = storage.write_shard(tmp_path, 0, shard, {}, storage.clock())
    assert sidecar["samples"] == 3 and sidecar["tokens"] == 6
    assert storage.read_sidecar(tmp_path, 0) == sidecar
