"""Training batches: token ids, loss masks and the target's hidden states, online or offline.

- online (``extract.mode: online``): the merged train split is read into memory as token
  ids; each batch runs the target once (:func:`eyas.target.capture.capture`) and the
  hidden states are used and dropped, never stored.
- offline: samples come from the extracted shards (:class:`eyas.extract.reader.HiddenStates`),
  which carry their own ids and masks.

The data order is a pure function of ``(seed, epoch)``: step s reads global batch
``s mod steps_per_epoch`` of epoch ``s // steps_per_epoch``, and rank r takes every
world-th sample of it. Resuming at step s therefore needs nothing but s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from eyas.config import ConfigError
from eyas.paths import RunPaths
from eyas.stage import StageError
from eyas.target.capture import capture


@dataclass
class Sample:
    input_ids: np.ndarray
    loss_mask: np.ndarray


@dataclass
class Batch:
    input_ids: torch.Tensor
    """[B,T] int64, right-padded with 0."""
    loss_mask: torch.Tensor
    """[B,T] bool, False on padding."""
    aux: torch.Tensor
    """[B,T,3·H_target]."""
    final: torch.Tensor
    """[B,T,H_target] after the target's final norm."""
    tokens: int
    """Real (unpadded) tokens in the batch."""


def read_split(paths: RunPaths, split: str, max_seq_len: int) -> list[Sample]:
    """A merged split's ids and masks, each truncated to ``max_seq_len``."""
    from eyas.merge.reader import iter_split

    return [
        Sample(
            np.asarray(row["input_ids"][:max_seq_len], dtype=np.int64),
            np.asarray(row["loss_mask"][:max_seq_len], dtype=bool),
        )
        for row in iter_split(paths, split, columns=["input_ids", "loss_mask"])
    ]


def pad(samples: list[Sample], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(s.input_ids) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros(len(samples), longest, dtype=torch.bool)
    for i, s in enumerate(samples):
        ids[i, : len(s.input_ids)] = torch.from_numpy(s.input_ids)
        mask[i, : len(s.loss_mask)] = torch.from_numpy(s.loss_mask)
    return ids.to(device), mask.to(device)


def stack_padded(rows: list[torch.Tensor], length: int) -> torch.Tensor:
    """[B, length, D] from per-sample [T_i, D] states, zeros after each sample's end."""
    out = torch.zeros(len(rows), length, rows[0].shape[-1], dtype=rows[0].dtype, device=rows[0].device)
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row
    return out


class OnlineSource:
    """Samples whose hidden states the target computes per batch, in this process.

    With ``cache``, each sample's states are computed alone (no padding, so they are the
    same whichever batch asks first, and a resumed run stays exact) and kept in memory:
    epochs after the first skip the target entirely.
    """

    def __init__(
        self, samples: list[Sample], model, aux_layers: list[int], device: torch.device, cache: bool = False
    ) -> None:
        self.samples, self.model, self.aux_layers, self.device = samples, model, aux_layers, device
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = {} if cache else None

    def __len__(self) -> int:
        return len(self.samples)

    def lengths(self) -> list[int]:
        return [len(s.input_ids) for s in self.samples]

    def batch(self, indices: list[int]) -> Batch:
        ids, mask = pad([self.samples[i] for i in indices], self.device)
        tokens = sum(len(self.samples[i].input_ids) for i in indices)
        if self.cache is not None:
            aux, final = self._cached(indices, ids.shape[1])
            return Batch(ids, mask, aux, final, tokens)
        # Right padding needs no attention mask: causal attention keeps real positions
        # from ever seeing the padding after them, and padded positions carry no loss.
        states = capture(self.model, ids, aux_layers=self.aux_layers)
        # capture runs under inference_mode; a clone is an ordinary tensor autograd may save.
        return Batch(ids, mask, states.aux.clone(), states.final.clone(), tokens)

    def _cached(self, indices: list[int], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        for i in indices:
            if i not in self.cache:
                one = torch.from_numpy(self.samples[i].input_ids)[None].to(self.device)
                states = capture(self.model, one, aux_layers=self.aux_layers)
                self.cache[i] = (states.aux[0].clone(), states.final[0].clone())
        return stack_padded([self.cache[i][0] for i in indices], length), stack_padded(
            [self.cache[i][1] for i in indices], length
        )


class OfflineSource:
    """Samples and hidden states read from the extracted shards.

    Sample i is row i of the merged train split, found in the shards by its id: the shards may
    hold more rows than the split, so that a split of some of the run's rows (``eyas scaling``'s
    subsets) trains from the run's own shards without extracting again.
    """

    def __init__(self, paths: RunPaths, max_seq_len: int, device: torch.device) -> None:
        from eyas.extract.reader import HiddenStates
        from eyas.merge.reader import iter_split

        self.states = HiddenStates(paths.hidden_dir)
        self.max_seq_len, self.device = max_seq_len, device
        rows = [(row["id"], row["num_tokens"]) for row in iter_split(paths, "train", ["id", "num_tokens"])]
        where = {sample_id: i for i, sample_id in enumerate(self.states.ids())}
        missing = [sample_id for sample_id, _ in rows if sample_id not in where]
        if missing:
            raise StageError(
                f"{paths.hidden_dir}: {len(missing)} of the merged train split's {len(rows)} samples are not in the "
                f"shards (first: {missing[0]}); rerun `eyas extract CONFIG`"
            )
        self._rows = [where[sample_id] for sample_id, _ in rows]
        self._lengths = [min(n, max_seq_len) for _, n in rows]

    def lengths(self) -> list[int]:
        return self._lengths

    @property
    def aux_layers(self) -> list[int]:
        return list(self.states.aux_layers)

    def __len__(self) -> int:
        return len(self._rows)

    def batch(self, indices: list[int]) -> Batch:
        items = [self.states[self._rows[i]] for i in indices]
        n = self.max_seq_len
        samples = [
            Sample(np.asarray(s.input_ids[:n], dtype=np.int64), np.asarray(s.loss_mask[:n], dtype=bool)) for s in items
        ]
        ids, mask = pad(samples, self.device)
        aux = stack_padded([s.aux[:n] for s in items], ids.shape[1]).to(self.device)
        final = stack_padded([s.final[:n] for s in items], ids.shape[1]).to(self.device)
        return Batch(ids, mask, aux, final, sum(len(s.input_ids) for s in samples))


GROUP_BATCHES = 32
"""Batches per length group: samples of similar length share a batch (less padding, which
both the target forward and the drafter would spend compute on), while the group is large
enough that batch order stays random."""


def steps_per_epoch(num_samples: int, batch_size: int) -> int:
    """Full batches in one pass over the samples (the last partial one is left out)."""
    return max(1, num_samples // batch_size)


def total_steps(cfg, num_samples: int) -> int:
    """Optimizer steps a run on ``num_samples`` trains for: ``train.epochs`` passes, at most
    ``train.max_steps``."""
    total = math.ceil(cfg.epochs * steps_per_epoch(num_samples, cfg.batch_size))
    return min(total, cfg.max_steps) if cfg.max_steps else total


class Schedule:
    """Which samples each optimizer step reads."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int) -> None:
        self.lengths, self.batch_size, self.seed = lengths, batch_size, seed
        self._epoch: int | None = None
        self._batches: list[list[int]] = []

    @property
    def num_samples(self) -> int:
        return len(self.lengths)

    @property
    def steps_per_epoch(self) -> int:
        return steps_per_epoch(self.num_samples, self.batch_size)

    def global_batch(self, step: int) -> list[int]:
        epoch, index = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._epoch, self._batches = epoch, self._epoch_batches(epoch)
        return self._batches[index]

    def rank_batch(self, step: int, rank: int, world: int) -> list[int]:
        return self.global_batch(step)[rank::world]

    def _epoch_batches(self, epoch: int) -> list[list[int]]:
        """Shuffle, sort each group of GROUP_BATCHES batches by length, then shuffle the batches."""
        generator = torch.Generator().manual_seed(self.seed + epoch)
        size = min(self.batch_size, self.num_samples)
        order = torch.randperm(self.num_samples, generator=generator).tolist()[: self.steps_per_epoch * size]
        batches = []
        for start in range(0, len(order), size * GROUP_BATCHES):
            group = sorted(order[start : start + size * GROUP_BATCHES], key=lambda i: self.lengths[i])
            batches.extend(group[i : i + size] for i in range(0, len(group), size))
        return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def check_sizes(num_samples: int, batch_size: int, world: int, source: str) -> None:
    if num_samples == 0:
        raise StageError(f"{source}: the training split is empty")
    if batch_size % world:
        raise ConfigError(f"train.batch_size: {batch_size} is not divisible by the {world} data-parallel ranks")
    if min(num_samples, batch_size) < world:
        raise StageError(f"{source}: {num_samples} samples cannot feed {world} ranks")
