"""The data order: a pure function of (seed, epoch), length-grouped, split across ranks."""

from __future__ import annotations

import random

from eyas.train.data import Schedule


def test_epochs_cover_samples_once_and_repeat_deterministically():
    lengths = [random.Random(i).randint(5, 500) for i in range(100)]
    schedule = Schedule(lengths, batch_size=8, seed=3)
    assert schedule.steps_per_epoch == 12
    epoch0 = [schedule.global_batch(s) for s in range(12)]
    seen = [i for b in epoch0 for i in b]
    assert len(seen) == len(set(seen)) == 96 and all(len(b) == 8 for b in epoch0)
    again = Schedule(lengths, batch_size=8, seed=3)
    assert [again.global_batch(s) for s in range(12, 24)] == [schedule.global_batch(s) for s in range(12, 24)]
    assert [schedule.global_batch(s) for s in range(12, 24)] != epoch0
    # Grouping by length: a batch spans far less than the whole range of lengths.
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in epoch0) / 12
    assert spread < 150


def test_ranks_split_the_global_batch():
    schedule = Schedule(list(range(40)), batch_size=8, seed=0)
    parts = [schedule.rank_batch(5, r, 2) for r in range(2)]
    assert sorted(parts[0] + parts[1]) == sorted(schedule.global_batch(5))
    assert not set(parts[0]) & set(parts[1])


def test_fewer_samples_than_batch_size():
    schedule = Schedule([3, 4, 5], batch_size=8, seed=0)
    assert schedule.steps_per_epoch == 1 and sorted(schedule.global_batch(4)) == [0, 1, 2]
