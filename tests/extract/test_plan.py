from eyas.extract.plan import bytes_per_token, default_shard_tokens, plan_batches, plan_shards, rank_shards


def test_shards_are_contiguous_runs_under_the_token_cap():
    assert plan_shards([30, 30, 30, 100, 10], 64) == [range(0, 2), range(2, 3), range(3, 4), range(4, 5)]
    assert plan_shards([], 64) == []
    shards = plan_shards(list(range(1, 200)), 500)
    assert [i for s in shards for i in s] == list(range(199))


def test_ranks_split_shards_without_overlap():
    parts = [rank_shards(10, r, 3) for r in range(3)]
    assert sorted(i for p in parts for i in p) == list(range(10))
    assert parts[1] == [1, 4, 7]


def test_batches_sort_by_length_and_respect_padded_budget():
    lengths = [5, 40, 12, 39, 100, 6]
    batches = plan_batches(lengths, 80)
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert batches[0] == [4]  # longer than the budget: alone, and first
    for b in batches:
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 80


def test_bytes_per_token_and_default_shard_size():
    # Reference shape: 4 layers of 7,168 values in bf16 ≈ 57 KB per token.
    assert bytes_per_token(7168, 3, "bf16") == 4 * 7168 * 2 + 5
    # fp8: the 3 aux layers in e4m3 (1 byte) + a float32 scale each; final stays bf16 (2 bytes).
    assert bytes_per_token(7168, 3, "fp8") == 3 * 7168 * 1 + 3 * 4 + 7168 * 2 + 5 == 35_857
    assert 18_000 < default_shard_tokens(7168, 3, "bf16") < 19_000
    assert default_shard_tokens(7168, 3, "fp8") == 2**30 // 35_857 == 29_945
