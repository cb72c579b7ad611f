"""Batches against brute force: token budget, epoch coverage, shuffling, packing layout, resume."""

import collections
import json
import random

import numpy as np
import pytest

from transformer_jax.data.batching import (
    TrainBatches,
    default_bucket_boundaries,
    eval_batches,
    rows_for_length,
)

PAD, BOS, EOS = 0, 1, 2
MAX_LEN = 64
BUDGET = 1024


def random_pairs(count=600, seed=0, longest=80):
    """Token pairs with ids 4..99; some longer than MAX_LEN so that they are dropped."""
    rng = random.Random(seed)

    def side():
        return [rng.randint(4, 99) for _ in range(rng.choice([rng.randint(1, 20), rng.randint(1, longest)]))]

    return [(side(), side()) for _ in range(count)]


def one_epoch(batches):
    """Every batch of the epoch the iterator is at, starting at its current index."""
    epoch, out = batches.epoch, []
    while batches.epoch == epoch:
        out.append(next(batches))
    return out


def unpadded_rows(batch):
    """[(source + eos, target + eos)] of the non-padding rows, read up to the first eos."""
    rows = []
    for inputs, targets in zip(batch["inputs"], batch["targets"]):
        if inputs[0] == PAD:
            assert not targets.any()
            continue
        cut = lambda row: tuple(row[: list(row).index(EOS) + 1])
        rows.append((cut(inputs), cut(targets)))
    return rows


def expected_examples(pairs):
    return collections.Counter(
        (tuple(s) + (EOS,), tuple(t) + (EOS,)) for s, t in pairs if max(len(s), len(t)) + 1 <= MAX_LEN
    )


def test_default_bucket_boundaries():
    assert default_bucket_boundaries(256) == (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
    assert default_bucket_boundaries(100) == (8, 16, 24, 32, 48, 64, 96, 100)


def test_budget_coverage_and_shapes():
    pairs = random_pairs()
    batches = TrainBatches(pairs, tokens_per_batch=BUDGET, max_len=MAX_LEN, batch_multiple=4)
    epoch = one_epoch(batches)
    assert batches.dropped == sum(max(len(s), len(t)) + 1 > MAX_LEN for s, t in pairs) > 0
    seen = collections.Counter(row for batch in epoch for row in unpadded_rows(batch))
    assert seen == expected_examples(pairs)  # every kept pair exactly once
    shapes = {batch["inputs"].shape for batch in epoch}
    assert len(shapes) <= len(default_bucket_boundaries(MAX_LEN))
    for batch in epoch:
        rows, length = batch["inputs"].shape
        assert batch["targets"].shape == batch["decoder_inputs"].shape == (rows, length)
        assert rows * length <= BUDGET and rows % 4 == 0
        assert rows == rows_for_length(length, BUDGET, 4)  # a fixed function of the bucket
        for name in ("inputs", "targets", "decoder_inputs"):
            assert batch[name].dtype == np.int32
        # decoder inputs: targets shifted right, bos first, eos removed, padding kept
        shifted = np.concatenate([np.full((rows, 1), BOS), batch["targets"][:, :-1]], axis=1)
        shifted[shifted == EOS] = PAD
        shifted[batch["targets"] == PAD] = PAD
        assert (batch["decoder_inputs"] == shifted).all()


def test_seed_determinism_and_epochs():
    pairs = random_pairs()

    def first_inputs(seed, epochs=1):
        batches = TrainBatches(pairs, tokens_per_batch=BUDGET, max_len=MAX_LEN, seed=seed)
        return [[batch["inputs"].tolist() for batch in one_epoch(batches)] for _ in range(epochs)]

    same_a, same_b = first_inputs(3, epochs=2), first_inputs(3, epochs=2)
    assert same_a == same_b
    assert first_inputs(4)[0] != same_a[0]
    assert same_a[1] != same_a[0]  # epoch 1 reshuffles (seed + 1) ...
    assert same_a[1][0] == first_inputs(4)[0][0]  # ... exactly as epoch 0 of seed + 1 does


def test_too_small_budget_names_the_fix():
    with pytest.raises(ValueError, match="at least 256"):
        TrainBatches(random_pairs(10), tokens_per_batch=100, max_len=MAX_LEN, batch_multiple=4)


def brute_force_packed_row(pairs, indices, length):
    """The packed row built by hand from the original pairs."""
    row = collections.defaultdict(list)
    for segment, index in enumerate(indices, start=1):
        source, target = list(pairs[index][0]) + [EOS], list(pairs[index][1]) + [EOS]
        row["inputs"] += source
        row["inputs_segmentation"] += [segment] * len(source)
        row["inputs_position"] += list(range(len(source)))
        row["targets"] += target
        row["decoder_inputs"] += [BOS] + target[:-1]
        row["targets_segmentation"] += [segment] * len(target)
        row["targets_position"] += list(range(len(target)))
    return {name: values + [0] * (length - len(values)) for name, values in row.items()}


def test_packed_rows_match_brute_force():
    pairs = random_pairs(300)
    batches = TrainBatches(pairs, tokens_per_batch=BUDGET, max_len=MAX_LEN, pack=True, seed=1)
    placed = collections.Counter()
    rows_per_batch = rows_for_length(MAX_LEN, BUDGET, 1)
    for length, rows in batches.epoch_plan(0):
        batch = next(batches)
        assert set(batch) == {
            "inputs",
            "targets",
            "decoder_inputs",
            "inputs_segmentation",
            "inputs_position",
            "targets_segmentation",
            "targets_position",
        }
        assert batch["inputs"].shape == (rows_per_batch, MAX_LEN)
        for row, indices in enumerate(rows):
            placed.update(indices)
            expected = brute_force_packed_row(pairs, indices, MAX_LEN)
            for name, values in expected.items():
                assert batch[name][row].tolist() == values, name
        assert not batch["inputs"][len(rows) :].any()
    kept = [i for i, (s, t) in enumerate(pairs) if max(len(s), len(t)) + 1 <= MAX_LEN]
    assert placed == collections.Counter(kept)  # every kept pair in exactly one row
    assert len(batches.epoch_plan(0)) < len(kept) / rows_per_batch  # rows really hold several pairs


@pytest.mark.parametrize("pack", [False, True])
def test_restore_mid_epoch_gives_the_same_batches(pack):
    pairs = random_pairs(200)
    options = dict(tokens_per_batch=BUDGET, max_len=MAX_LEN, seed=5, pack=pack)
    batches = TrainBatches(pairs, **options)
    per_epoch = len(batches.epoch_plan(0))
    for _ in range(per_epoch - 2):
        next(batches)
    saved = json.loads(json.dumps(batches.state()))
    assert saved == {"epoch": 0, "index": per_epoch - 2}
    following = [next(batches) for _ in range(5)]  # crosses into epoch 1
    resumed = TrainBatches(pairs, **options)
    resumed.restore(saved)
    for expected, actual in zip(following, [next(resumed) for _ in range(5)]):
        assert expected.keys() == actual.keys()
        for name in expected:
            np.testing.assert_array_equal(expected[name], actual[name])
    assert resumed.state() == batches.state() == {"epoch": 1, "index": 3}
    with pytest.raises(ValueError, match="epoch 0 has .* batches here"):
        resumed.restore({"epoch": 0, "index": per_epoch})


def test_pairs_given_by_epoch_are_each_epochs_and_a_resume_recomputes_them():
    """Pairs as a function of the epoch (segmentations sampled anew each epoch): epoch e holds pairs(e)'s kept pairs
    exactly once, and a run restored mid-epoch asks for that epoch again and continues with the same batches."""
    by_epoch = {epoch: random_pairs(200, seed=10 + epoch) for epoch in range(3)}
    asked = []

    def pairs_of(epoch):
        asked.append(epoch)
        return by_epoch[epoch]

    options = dict(tokens_per_batch=BUDGET, max_len=MAX_LEN, seed=5)
    batches = TrainBatches(pairs_of, **options)
    assert batches.dropped == sum(max(len(s), len(t)) + 1 > MAX_LEN for s, t in by_epoch[0])
    for epoch in range(3):
        seen = collections.Counter(row for batch in one_epoch(batches) for row in unpadded_rows(batch))
        assert seen == expected_examples(by_epoch[epoch]), epoch
    assert asked == [0, 1, 2]  # each epoch's pairs asked for once

    batches = TrainBatches(pairs_of, **options)
    one_epoch(batches)
    next(batches), next(batches)
    saved = batches.state()
    assert saved == {"epoch": 1, "index": 2}
    following = [next(batches) for _ in range(3)]
    asked.clear()
    resumed = TrainBatches(pairs_of, **options)
    resumed.restore(saved)
    for expected, actual in zip(following, [next(resumed) for _ in range(3)]):
        np.testing.assert_array_equal(expected["targets"], actual["targets"])
    assert asked == [0, 1]  # epoch 0 for the start-up count, then only the epoch it resumed in


def test_shards_split_each_global_batch():
    pairs = random_pairs(200)
    options = dict(tokens_per_batch=BUDGET, max_len=MAX_LEN, batch_multiple=2)
    whole = TrainBatches(pairs, **options)
    shards = [TrainBatches(pairs, shard_index=i, shard_count=2, **options) for i in range(2)]
    for _ in range(10):
        expected = next(whole)
        parts = [next(shard) for shard in shards]
        for name in expected:
            np.testing.assert_array_equal(np.concatenate([part[name] for part in parts]), expected[name])


def test_eval_batches_keep_order_and_truncate():
    pairs = random_pairs(50, longest=100)
    seen = []
    for indices, batch in eval_batches(pairs, batch_size=8, max_len=MAX_LEN):
        assert batch["inputs"].shape[0] == 8 and batch["inputs"].shape[1] in default_bucket_boundaries(MAX_LEN)
        for row, index in enumerate(indices):
            if index < 0:
                assert not batch["inputs"][row].any()
                continue
            seen.append(int(index))
            source = pairs[index][0][: MAX_LEN - 1] + [EOS]
            assert batch["inputs"][row, : len(source)].tolist() == source
            assert not batch["inputs"][row, len(source) :].any()
    assert seen == list(range(len(pairs)))


def test_base_config_batches_hold_about_25k_real_tokens_a_side():
    """§5.1: ~25000 source and ~25000 target tokens per batch. tokens_per_batch counts padded positions, so
    experiments/base.py sets more; checked on generated pairs with WMT14-like BPE lengths (lognormal around 24
    source tokens, targets ~10% longer, tails to 256)."""
    import itertools

    from transformer_jax.experiment import load_experiment

    config = load_experiment("experiments/base.py")
    rng = np.random.default_rng(0)
    source_lengths = np.clip(rng.lognormal(np.log(24), 0.55, 40_000).astype(int), 1, 300)
    target_lengths = np.clip((source_lengths * rng.normal(1.1, 0.15, source_lengths.size)).astype(int), 1, 300)
    pairs = [([5] * s, [6] * t) for s, t in zip(source_lengths, target_lengths)]
    batches = TrainBatches(
        pairs,
        tokens_per_batch=config.data.tokens_per_batch,
        max_len=config.data.max_len,
        bucket_boundaries=tuple(config.data.bucket_boundaries) or None,
    )
    sample = list(itertools.islice(batches, 60))
    source = np.mean([(batch["inputs"] != 0).sum() for batch in sample])
    target = np.mean([(batch["targets"] != 0).sum() for batch in sample])
    assert 22_500 <= source <= 27_500 and 22_500 <= target <= 27_500, (source, target)
    slots = np.mean([batch["inputs"].size for batch in sample])
    assert slots <= config.data.tokens_per_batch  # the padded budget is never exceeded


def brute_force_bucket_plan(order, lengths, boundaries, rows):
    """The bucket plan by filling buckets one pair at a time (lengths with eos)."""
    plan, filling = [], {length: [] for length in boundaries}
    for index in order:
        length = next(boundary for boundary in boundaries if boundary >= lengths[index].max())
        filling[length].append([int(index)])
        if len(filling[length]) == rows[length]:
            plan.append((length, filling[length]))
            filling[length] = []
    return plan + [(length, batch) for length, batch in filling.items() if batch]


@pytest.mark.parametrize("seed", range(3))
def test_bucket_plan_fills_buckets_in_order_like_brute_force(seed):
    pairs = random_pairs(700, seed=seed)
    batches = TrainBatches(pairs, tokens_per_batch=BUDGET, max_len=MAX_LEN, seed=seed, batch_multiple=2)
    lengths = np.array([(len(s) + 1, len(t) + 1) for s, t in pairs])
    kept = np.flatnonzero(lengths.max(axis=1) <= MAX_LEN)
    order = kept[np.random.default_rng(seed).permutation(len(kept))]
    expected = brute_force_bucket_plan(order, lengths, default_bucket_boundaries(MAX_LEN), batches.rows)
    assert list(batches.epoch_plan(0)) == expected
