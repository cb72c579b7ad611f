"""Token pairs → batches of about `tokens_per_batch` tokens in a few static shapes (paper §5.1).

Each example is encoded as: inputs = source pieces + [eos]; targets = target pieces + [eos];
decoder_inputs = [bos] + target pieces (the targets shifted right by one).

A batch is a dict of int32 numpy arrays, padded with pad_id:
  'inputs' [rows, length], 'targets' [rows, length], 'decoder_inputs' [rows, length];
packed batches add 'inputs_segmentation', 'inputs_position', 'targets_segmentation', 'targets_position'
[rows, length]: segments numbered 1, 2, ... in each row (0 = padding), positions 0, 1, ... within a segment,
and each segment's decoder inputs start with bos, so no token sees another pair.

Bucketing: one length serves source and target; a pair goes to the smallest bucket boundary ≥ the longer
of its two sides. A bucket of length L always has rows(L) = the largest multiple of batch_multiple (and of
shard_count) with rows(L) · L ≤ tokens_per_batch, so source and target tokens, padding included, never
exceed the budget, and jit sees one shape per bucket. Packing: rows of length max_len, rows(max_len) rows.
Pairs longer than max_len (eos included) are dropped from training and counted (`TrainBatches.dropped`).
Padding (pad_id) in 'targets' marks the positions the loss must ignore.
The last batches of an epoch are topped up with all-pad rows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from transformer_jax.data.packing import Row, pack_rows
from transformer_jax.errors import DataError

TokenPair = tuple[Sequence[int], Sequence[int]]  # (source pieces, target pieces), no bos/eos
Batch = dict[str, np.ndarray]

logger = logging.getLogger(__name__)


def default_bucket_boundaries(max_len: int) -> tuple[int, ...]:
    """8, 16, 24, 32, 48, 64, 96, 128, 192, 256, ... (steps of about ×1.5) below max_len, then max_len."""
    steps, power = [8, 16, 24], 32
    while power < max_len:
        steps += [power, power * 3 // 2]
        power *= 2
    return tuple(step for step in steps if step < max_len) + (max_len,)


def _checked_boundaries(bucket_boundaries: Sequence[int] | None, max_len: int) -> tuple[int, ...]:
    boundaries = tuple(sorted(set(bucket_boundaries or default_bucket_boundaries(max_len))))
    if boundaries[-1] < max_len:
        raise ValueError(f"The last bucket boundary {boundaries[-1]} is below max_len={max_len}; add {max_len}.")
    return boundaries


def rows_for_length(length: int, tokens_per_batch: int, row_multiple: int) -> int:
    """The most rows, a multiple of row_multiple, with rows · length ≤ tokens_per_batch."""
    rows = tokens_per_batch // length // row_multiple * row_multiple
    if rows == 0:
        raise ValueError(
            f"tokens_per_batch={tokens_per_batch} cannot hold {row_multiple} rows of length "
            f"{length}; raise it to at least {length * row_multiple} or lower max_len."
        )
    return rows


def train_shapes(
    tokens_per_batch: int,
    max_len: int,
    bucket_boundaries: Sequence[int] | None = None,
    pack: bool = False,
    row_multiple: int = 1,
) -> dict[int, int]:
    """{bucket length: rows per global batch}, longest first: the static [rows, length] shapes of the training
    batches (`TrainBatches.rows`). Packed batches have one, max_len long. ValueError if a bucket cannot hold
    row_multiple rows."""
    boundaries = (max_len,) if pack else _checked_boundaries(bucket_boundaries, max_len)
    return {length: rows_for_length(length, tokens_per_batch, row_multiple) for length in reversed(boundaries)}


def _with_eos(pieces: Sequence[int], max_len: int, eos_id: int) -> np.ndarray:
    """pieces[:max_len - 1] + [eos] as int32 [length]."""
    return np.asarray(list(pieces[: max_len - 1]) + [eos_id], np.int32)


class _Examples:
    """Encoded examples with eos, and the assembly of batches from rows of example indices."""

    def __init__(self, pairs: Sequence[TokenPair], max_len: int, pad_id: int, bos_id: int, eos_id: int):
        self.sources = [_with_eos(source, max_len, eos_id) for source, _ in pairs]
        self.targets = [_with_eos(target, max_len, eos_id) for _, target in pairs]
        self.pad_id, self.bos_id = pad_id, bos_id

    def batch(self, rows: Sequence[Row], num_rows: int, length: int, packed: bool) -> Batch:
        """Rows of example indices → arrays [num_rows, length]; rows past len(rows) are all padding."""
        shape = (num_rows, length)
        arrays = {name: np.full(shape, self.pad_id, np.int32) for name in ("inputs", "targets", "decoder_inputs")}
        arrays.update(
            {
                name: np.zeros(shape, np.int32)
                for name in ("inputs_segmentation", "inputs_position", "targets_segmentation", "targets_position")
            }
        )
        for row, indices in enumerate(rows):
            source_start = target_start = 0
            for segment, index in enumerate(indices, start=1):
                source, target = self.sources[index], self.targets[index]
                source_span = slice(source_start, source_start + len(source))
                target_span = slice(target_start, target_start + len(target))
                arrays["inputs"][row, source_span] = source
                arrays["inputs_segmentation"][row, source_span] = segment
                arrays["inputs_position"][row, source_span] = np.arange(len(source))
                arrays["targets"][row, target_span] = target
                arrays["decoder_inputs"][row, target_span] = np.concatenate([[self.bos_id], target[:-1]])
                arrays["targets_segmentation"][row, target_span] = segment
                arrays["targets_position"][row, target_span] = np.arange(len(target))
                source_start, target_start = source_span.stop, target_span.stop
        if not packed:
            return {name: arrays[name] for name in ("inputs", "targets", "decoder_inputs")}
        return arrays


class _EpochExamples:
    """One epoch's pairs: those at most max_len long (eos included) kept, their lengths, their encoded examples."""

    def __init__(self, pairs: Sequence[TokenPair], max_len: int, pad_id: int, bos_id: int, eos_id: int):
        self.lengths = np.array([(len(source) + 1, len(target) + 1) for source, target in pairs], np.int64).reshape(
            -1, 2
        )  # [pairs, 2] with eos
        self.kept = np.flatnonzero(self.lengths.max(axis=1) <= max_len)
        self.dropped = len(pairs) - len(self.kept)
        if not len(self.kept):
            raise DataError(f"No pair is at most max_len={max_len} tokens long (eos included); raise data.max_len.")
        self.examples = _Examples(pairs, max_len, pad_id, bos_id, eos_id)


class TrainBatches:
    """Endless, shuffled training batches over epochs, resumable from `state()`.

    `pairs` are the token pairs of every epoch, or a function of the epoch that returns that epoch's (segmentations
    sampled anew each epoch: `Tokenizer.sample_pairs`); it must return the same pairs for the same epoch.
    Epoch e shuffles with seed + e and holds every kept pair exactly once. `state()` is
    {'epoch', 'index'} (index = batches already yielded in that epoch); `restore(state)` resumes there
    with exactly the batches that would have followed. With shard_count > 1 each process gets rows
    [shard_index · rows / shard_count, (shard_index + 1) · rows / shard_count) of every global batch.
    With pack=True, rows are max_len long and bucket_boundaries are not used.
    """

    def __init__(
        self,
        pairs: Sequence[TokenPair] | Callable[[int], Sequence[TokenPair]],
        *,
        tokens_per_batch: int,
        max_len: int,
        seed: int = 0,
        bucket_boundaries: Sequence[int] | None = None,
        batch_multiple: int = 1,
        pack: bool = False,
        shard_index: int = 0,
        shard_count: int = 1,
        pad_id: int = 0,
        bos_id: int = 1,
        eos_id: int = 2,
    ):
        if not 0 <= shard_index < shard_count:
            raise ValueError(f"Need 0 <= shard_index < shard_count, got {shard_index} and {shard_count}.")
        self._pairs, self._ids = pairs, (max_len, pad_id, bos_id, eos_id)
        self._fixed = None if callable(pairs) else _EpochExamples(pairs, *self._ids)  # every epoch's: built once
        first = self._examples(0)
        self.dropped = first.dropped
        logger.info(
            "Training batches: kept %d pairs, dropped %d longer than max_len=%d tokens (eos included)%s.",
            len(first.kept),
            self.dropped,
            max_len,
            "" if self._fixed else " in epoch 0 (each epoch samples its own segmentations)",
        )
        self.seed, self.pack, self.max_len = seed, pack, max_len
        self.shard_index, self.shard_count = shard_index, shard_count
        self.boundaries = (max_len,) if pack else _checked_boundaries(bucket_boundaries, max_len)
        row_multiple = math.lcm(batch_multiple, shard_count)
        # bucket length -> rows per global batch
        self.rows = train_shapes(tokens_per_batch, max_len, bucket_boundaries, pack, row_multiple)
        self.epoch, self.index = 0, 0
        self._plan_epoch = -1
        self._plan: list[tuple[int, list[Row]]] = []
        self._epoch_examples, self._examples_epoch = first, 0  # the examples of the epoch planned last

    def _examples(self, epoch: int) -> _EpochExamples:
        if self._fixed is not None:
            return self._fixed
        assert callable(self._pairs)
        return _EpochExamples(self._pairs(epoch), *self._ids)

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    def restore(self, state: dict[str, int]) -> None:
        epoch, index = int(state["epoch"]), int(state["index"])
        batches = len(self.epoch_plan(epoch))
        if not 0 <= index < batches:
            raise DataError(
                f"Cannot resume at {state}: epoch {epoch} has {batches} batches here. Were the "
                f"data, the tokenizer or the batching options changed since it was saved?"
            )
        self.epoch, self.index = epoch, index

    def epoch_plan(self, epoch: int) -> list[tuple[int, list[Row]]]:
        """[(length, rows of example indices)] for every global batch of `epoch`, in order."""
        if epoch != self._plan_epoch:
            if epoch != self._examples_epoch:
                self._epoch_examples, self._examples_epoch = self._examples(epoch), epoch
            self._plan = self._make_plan(self._epoch_examples, epoch)
            self._plan_epoch = epoch
        return self._plan

    def _make_plan(self, examples: _EpochExamples, epoch: int) -> list[tuple[int, list[Row]]]:
        order = examples.kept[np.random.default_rng(self.seed + epoch).permutation(len(examples.kept))]
        return self._pack_plan(order, examples.lengths) if self.pack else self._bucket_plan(order, examples.lengths)

    def _bucket_plan(self, order: np.ndarray, lengths: np.ndarray) -> list[tuple[int, list[Row]]]:
        bucket_of = np.searchsorted(self.boundaries, lengths.max(axis=1))  # [pairs]
        plan: list[tuple[int, list[Row]]] = []
        filling: dict[int, list[Row]] = {length: [] for length in self.boundaries}
        for index in order:
            length = self.boundaries[bucket_of[index]]
            filling[length].append([int(index)])
            if len(filling[length]) == self.rows[length]:
                plan.append((length, filling[length]))
                filling[length] = []
        plan.extend((length, rows) for length, rows in filling.items() if rows)
        return plan

    def _pack_plan(self, order: np.ndarray, lengths: np.ndarray) -> list[tuple[int, list[Row]]]:
        batches = pack_rows(order, lengths[:, 0], lengths[:, 1], self.max_len, self.rows[self.max_len])
        return [(self.max_len, rows) for rows in batches]

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        plan = self.epoch_plan(self.epoch)
        length, rows = plan[self.index]
        self.index += 1
        if self.index == len(plan):
            self.epoch, self.index = self.epoch + 1, 0
        num_rows = self.rows[length] // self.shard_count
        first = self.shard_index * num_rows
        return self._epoch_examples.examples.batch(rows[first : first + num_rows], num_rows, length, self.pack)


def eval_batches(
    pairs: Sequence[TokenPair],
    *,
    batch_size: int,
    max_len: int,
    bucket_boundaries: Sequence[int] | None = None,
    pad_id: int = 0,
    bos_id: int = 1,
    eos_id: int = 2,
) -> Iterator[tuple[np.ndarray, Batch]]:
    """Every pair once, in order: (indices [batch_size], batch) with batch_size rows per batch.

    Nothing is dropped: sides longer than max_len keep their first max_len - 1 pieces and eos. A batch is
    as long as the bucket of its longest pair; `indices` holds each row's position in `pairs`, -1 for the
    all-pad rows that fill the last batch.
    """
    boundaries = _checked_boundaries(bucket_boundaries, max_len)
    examples = _Examples(pairs, max_len, pad_id, bos_id, eos_id)
    for start in range(0, len(pairs), batch_size):
        indices = np.arange(start, min(start + batch_size, len(pairs)))
        longest = max(max(len(examples.sources[i]), len(examples.targets[i])) for i in indices)
        length = boundaries[int(np.searchsorted(boundaries, longest))]
        batch = examples.batch([[int(i)] for i in indices], batch_size, length, packed=False)
        yield np.pad(indices, (0, batch_size - len(indices)), constant_values=-1).astype(np.int32), batch
