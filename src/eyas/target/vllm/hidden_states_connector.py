"""vLLM's hidden-states connector, made to work on the CPU build too; imported by vLLM's workers.

``extract_child.py`` captures hidden states with vLLM's own ``extract_hidden_states``
speculative method, which caches the chosen layers' states beside the KV cache, and its
``ExampleHiddenStatesConnector``, which writes each finished request's states to a
safetensors file. On accelerators the stock connector copies them out asynchronously
through pinned memory and CUDA events; the CPU build has neither (``pin_memory=True``
fails, its event stand-in has no ``query()``). There the cache already is host memory, so
this subclass copies the rows synchronously and hands the write to the connector's own
writer thread with an already-finished event; on accelerators it is the stock connector.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Finished:
    """An event that has already happened (the copy was synchronous)."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


class HiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        if self._kv_cache.device.type != "cpu":
            super()._submit_async_write(pending)
            return
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slot_mapping = (offsets[None, :] + block_ids[:, None] * self._block_size).flatten()
        # A copy, not a view: the blocks are freed for other requests once this one is reported finished.
        states = extract_from_kv_cache(self._kv_cache, slot_mapping, pending.token_ids.shape[0]).clone()
        tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _Finished()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
