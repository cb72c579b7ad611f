"""One epoch's global batches as flat index arrays: which pairs go in which row of which batch, in order.

Arrays rather than lists of lists, so that an epoch of WMT14 EN→FR's 36M pairs costs a few hundred MB, not
gigabytes of Python integers; the bucket plan is computed without a Python loop over pairs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from transformer_jax.data.packing import Row, pack_rows


@dataclasses.dataclass(frozen=True)
class EpochPlan:
    """Batch b has length `lengths[b]` and rows `first_row[b] .. first_row[b + 1] - 1`; row r holds the pairs
    `pairs[row_start[r]:row_start[r + 1]]` (several when packing), or pair r alone where row_start is None
    (bucketing)."""

    lengths: np.ndarray  # [batches] the bucket length of each batch
    first_row: np.ndarray  # [batches + 1] into row_start
    row_start: np.ndarray | None  # [rows + 1] into pairs; None: one pair a row
    pairs: np.ndarray  # [pairs] pair indices, row by row

    def __len__(self) -> int:
        return len(self.lengths)

    def rows(self, batch: int, first: int = 0, count: int | None = None) -> list[np.ndarray]:
        """The pair indices of rows first .. first + count - 1 of `batch` (fewer where the batch has fewer)."""
        start = self.first_row[batch] + first
        stop = self.first_row[batch + 1] if count is None else min(start + count, self.first_row[batch + 1])
        if self.row_start is None:
            return [self.pairs[row : row + 1] for row in range(start, stop)]
        return [self.pairs[self.row_start[row] : self.row_start[row + 1]] for row in range(start, stop)]

    def __iter__(self) -> Iterator[tuple[int, list[Row]]]:
        """(length, rows as lists of pair indices) of each batch, in order."""
        for batch, length in enumerate(self.lengths):
            yield int(length), [row.tolist() for row in self.rows(batch)]


def bucket_plan(order: np.ndarray, longer_side: np.ndarray, rows: Mapping[int, int]) -> EpochPlan:
    """Pairs `order` (shuffled) fill the bucket of their longer side; a bucket of length L closes a batch when it
    holds rows[L] pairs, and the batches come in the order they close; the part-filled ones follow, shortest bucket
    first. `longer_side` [pairs] with eos; `rows` {bucket length: rows per batch}.

    Vectorized: within a bucket the pairs keep their order, so its k-th batch is its pairs k·R .. (k+1)·R - 1, and
    closes at the position of the last of them."""
    boundaries = np.array(sorted(rows))
    bucket = np.searchsorted(boundaries, longer_side[order])  # [pairs] bucket of each position of `order`
    grouped = np.argsort(bucket, kind="stable")  # positions of `order`, bucket by bucket, in order within each
    counts = np.bincount(bucket, minlength=len(boundaries))
    starts, sizes, closes, lengths = [], [], [], []  # per batch: its first entry of `grouped`, pairs, closing time
    offset = 0
    for index, (length, count) in enumerate(zip(boundaries.tolist(), counts.tolist())):
        first = offset + np.arange(0, count, rows[length])  # [batches of this bucket]
        size = np.minimum(rows[length], offset + count - first)
        starts.append(first)
        sizes.append(size)
        closes.append(np.where(size == rows[length], grouped[first + size - 1], len(order) + index))
        lengths.append(np.full(len(first), length, np.int64))
        offset += count
    by_closing = np.argsort(np.concatenate(closes), kind="stable")
    first, size = np.concatenate(starts)[by_closing], np.concatenate(sizes)[by_closing]
    ends = np.cumsum(size)  # [batches] where each batch ends in the plan
    positions = np.repeat(first - (ends - size), size) + np.arange(len(order))  # [pairs] entries of `grouped`
    return EpochPlan(
        np.concatenate(lengths)[by_closing],
        np.concatenate([[0], ends]).astype(np.int64),
        None,
        order[grouped[positions]],
    )


def pack_plan(order: np.ndarray, lengths: np.ndarray, row_length: int, rows_per_batch: int) -> EpochPlan:
    """First-fit packing (data/packing.pack_rows) of the pairs `order` into batches of rows `row_length` long;
    `lengths` [pairs, 2] with eos."""
    batches = pack_rows(order, lengths[:, 0], lengths[:, 1], row_length, rows_per_batch)
    rows: Sequence[Row] = [row for batch in batches for row in batch]
    return EpochPlan(
        np.full(len(batches), row_length, np.int64),
        np.concatenate([[0], np.cumsum([len(batch) for batch in batches])]).astype(np.int64),
        np.concatenate([[0], np.cumsum([len(row) for row in rows])]).astype(np.int64),
        np.array([index for row in rows for index in row], np.int64),
    )
