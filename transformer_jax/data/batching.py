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

import functools
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import grain
import numpy as np

from transformer_jax.data.epoch_plan import EpochPlan, bucket_plan, pack_plan
from transformer_jax.data.token_pairs import Ragged, TokenPair, TokenPairList, TokenPairs
from transformer_jax.errors import DataError

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


class _Layout(NamedTuple):
    """How pairs become rows: the longest side (eos included; longer ones are cut) and the special ids."""

    max_len: int
    pad_id: int
    bos_id: int
    eos_id: int

    def batch(
        self, per_row: np.ndarray, sources: Ragged, targets: Ragged, num_rows: int, length: int, packed: bool
    ) -> Batch:
        """Pairs → arrays [num_rows, length]: the first per_row[0] pairs fill row 0, the next per_row[1] row 1, ...;
        rows past len(per_row) are all padding. Vectorized over the batch's tokens: each side is laid out flat with
        its eos, then scattered to (row, column)."""
        shape = (num_rows, length)
        arrays = {name: np.full(shape, self.pad_id, np.int32) for name in ("inputs", "targets", "decoder_inputs")}
        if packed:
            segments = ("inputs_segmentation", "inputs_position", "targets_segmentation", "targets_position")
            arrays.update({name: np.zeros(shape, np.int32) for name in segments})
        if not per_row.sum():
            return arrays
        row_first = np.repeat(np.cumsum(per_row) - per_row, per_row)  # [pairs] the first pair of its row
        row_of = np.repeat(np.arange(len(per_row)), per_row)  # [pairs]
        for name, side in (("inputs", sources), ("targets", targets)):
            pieces = side.truncated(self.max_len - 1)
            sizes = pieces.lengths + 1  # [pairs] with eos
            ends = np.cumsum(sizes)
            starts = ends - sizes  # [pairs] where each pair's tokens begin in `flat`
            flat = np.full(ends[-1], self.eos_id, np.int32)  # [tokens] every pair's pieces and eos, one after another
            is_piece = np.ones(ends[-1], bool)
            is_piece[ends - 1] = False
            flat[is_piece] = pieces.tokens
            position = np.arange(ends[-1]) - np.repeat(starts, sizes)  # [tokens] within its pair
            column = np.repeat(starts - starts[row_first], sizes) + position  # pairs of a row follow each other
            row = np.repeat(row_of, sizes)
            arrays[name][row, column] = flat
            if name == "targets":  # decoder inputs: the targets shifted right by one, each pair starting with bos
                shifted = np.concatenate([[self.bos_id], flat[:-1]])
                shifted[starts] = self.bos_id
                arrays["decoder_inputs"][row, column] = shifted
            if packed:
                arrays[f"{name}_segmentation"][row, column] = np.repeat(np.arange(len(row_of)) - row_first + 1, sizes)
                arrays[f"{name}_position"][row, column] = position
        return arrays


class _EpochPairs(NamedTuple):
    """One epoch's pairs, their lengths with eos [pairs, 2], and the indices of those at most max_len long (the
    smallest unsigned type that holds them: an epoch of 36M pairs plans in a few hundred MB)."""

    pairs: TokenPairs
    lengths: np.ndarray
    kept: np.ndarray

    @classmethod
    def of(cls, pairs: TokenPairs, max_len: int) -> _EpochPairs:
        lengths = pairs.lengths() + 1  # [pairs, 2] int32
        kept = np.flatnonzero(lengths.max(axis=1) <= max_len).astype(np.min_scalar_type(len(lengths)))
        if not len(kept):
            raise DataError(f"No pair is at most max_len={max_len} tokens long (eos included); raise data.max_len.")
        return cls(pairs, lengths, kept)


class TrainBatches:
    """Endless, shuffled training batches over epochs, resumable from `state()`.

    `pairs` are the token pairs of every epoch (a sequence, or `TokenPairs` such as prepared data on disk), or a
    function of the epoch that returns that epoch's (segmentations sampled anew each epoch:
    `Tokenizer.sample_pairs`); it must return the same pairs for the same epoch.
    Epoch e shuffles with seed + e and holds every kept pair exactly once. `state()` is
    {'epoch', 'index'} (index = batches already yielded in that epoch); `restore(state)` resumes there
    with exactly the batches that would have followed. With shard_count > 1 each process gets rows
    [shard_index · rows / shard_count, (shard_index + 1) · rows / shard_count) of every global batch, and reads only
    their pairs. With pack=True, rows are max_len long and bucket_boundaries are not used.

    The batches are made by a grain dataset over the epoch's plan (`read_threads` threads, `prefetch` batches
    ahead), in order.
    """

    def __init__(
        self,
        pairs: TokenPairs | Sequence[TokenPair] | Callable[[int], Sequence[TokenPair]],
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
        read_threads: int = 2,
        prefetch: int = 8,
    ):
        if not 0 <= shard_index < shard_count:
            raise ValueError(f"Need 0 <= shard_index < shard_count, got {shard_index} and {shard_count}.")
        self._pairs, self._layout = pairs, _Layout(max_len, pad_id, bos_id, eos_id)
        self._fixed = None if callable(pairs) else _EpochPairs.of(_token_pairs(pairs), max_len)  # built once
        first = self._epoch_pairs(0)
        self.dropped = len(first.lengths) - len(first.kept)
        logger.info(
            "Training batches: kept %d pairs, dropped %d longer than max_len=%d tokens (eos included)%s.",
            len(first.kept),
            self.dropped,
            max_len,
            "" if self._fixed else " in epoch 0 (each epoch samples its own segmentations)",
        )
        self.seed, self.pack, self.max_len = seed, pack, max_len
        self.shard_index, self.shard_count = shard_index, shard_count
        row_multiple = math.lcm(batch_multiple, shard_count)
        # bucket length -> rows per global batch
        self.rows = train_shapes(tokens_per_batch, max_len, bucket_boundaries, pack, row_multiple)
        self.read_options = grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=prefetch)
        self.epoch, self.index = 0, 0
        self._planned: tuple[int, _EpochPairs, EpochPlan] | None = None  # the epoch planned last
        self._first_pairs: _EpochPairs | None = first
        self._iterator: Iterator[Batch] | None = None  # the grain iterator at (epoch, index)

    def _epoch_pairs(self, epoch: int) -> _EpochPairs:
        if self._fixed is not None:
            return self._fixed
        assert callable(self._pairs)
        return _EpochPairs.of(TokenPairList(self._pairs(epoch)), self._layout.max_len)

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
        self.epoch, self.index, self._iterator = epoch, index, None

    def epoch_plan(self, epoch: int) -> EpochPlan:
        """Every global batch of `epoch`, in order."""
        return self._plan(epoch)[1]

    def _plan(self, epoch: int) -> tuple[_EpochPairs, EpochPlan]:
        if self._planned is None or self._planned[0] != epoch:
            pairs = self._first_pairs if epoch == 0 and self._first_pairs is not None else self._epoch_pairs(epoch)
            self._first_pairs = None
            order = pairs.kept[np.random.default_rng(self.seed + epoch).permutation(len(pairs.kept))]
            if self.pack:
                plan = pack_plan(order, pairs.lengths, self.max_len, self.rows[self.max_len])
            else:
                plan = bucket_plan(order, pairs.lengths.max(axis=1), self.rows)
            self._planned = (epoch, pairs, plan)
        return self._planned[1], self._planned[2]

    def _batch(self, pairs: TokenPairs, plan: EpochPlan, batch: int) -> Batch:
        """This process's rows of global batch `batch`, reading only their pairs."""
        length = int(plan.lengths[batch])
        num_rows = self.rows[length] // self.shard_count
        rows = plan.rows(batch, self.shard_index * num_rows, num_rows)
        per_row = np.array([len(row) for row in rows], np.int64)
        sources, targets = pairs.read(np.concatenate(rows) if rows else np.zeros(0, np.int64))
        return self._layout.batch(per_row, sources, targets, num_rows, length, self.pack)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        pairs, plan = self._plan(self.epoch)
        if self._iterator is None:
            assemble = functools.partial(self._batch, pairs.pairs, plan)
            batches = grain.MapDataset.range(self.index, len(plan)).map(assemble)
            self._iterator = iter(batches.to_iter_dataset(self.read_options))
        batch = next(self._iterator)
        self.index += 1
        if self.index == len(plan):
            self.epoch, self.index, self._iterator = self.epoch + 1, 0, None
        return batch


def _token_pairs(pairs: TokenPairs | Sequence[TokenPair]) -> TokenPairs:
    return pairs if hasattr(pairs, "read") else TokenPairList(pairs)  # type: ignore[return-value]


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
    layout = _Layout(max_len, pad_id, bos_id, eos_id)
    for start in range(0, len(pairs), batch_size):
        indices = np.arange(start, min(start + batch_size, len(pairs)))
        sources, targets = TokenPairList([pairs[index] for index in indices.tolist()]).read(np.arange(len(indices)))
        longest = min(int(max(sources.lengths.max(), targets.lengths.max())) + 1, max_len)
        length = boundaries[int(np.searchsorted(boundaries, longest))]
        batch = layout.batch(np.ones(len(indices), np.int64), sources, targets, batch_size, length, packed=False)
        yield np.pad(indices, (0, batch_size - len(indices)), constant_values=-1).astype(np.int32), batch
