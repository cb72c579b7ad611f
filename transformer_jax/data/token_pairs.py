"""Encoded training pairs by index, as flat arrays: in memory (`TokenPairList`) or prepared on disk
(data/prepared.PreparedPairs); what data/batching reads its batches from.

A read returns each side as `Ragged`: the sequences end to end, `tokens` [total] and `lengths` [pairs], so that a
batch of a thousand pairs is laid out with a few array operations rather than a thousand.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import numpy as np

TokenPair = tuple[Sequence[int], Sequence[int]]  # (source pieces, target pieces), no bos/eos


class Ragged(NamedTuple):
    """Sequences end to end: `tokens` [total] int32, `lengths` [sequences]."""

    tokens: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, sequences: Sequence[Sequence[int]]) -> Ragged:
        lengths = np.fromiter(map(len, sequences), np.int64, len(sequences))
        return cls(np.fromiter(itertools.chain.from_iterable(sequences), np.int32, int(lengths.sum())), lengths)

    def truncated(self, most: int) -> Ragged:
        """Each sequence's first `most` tokens."""
        if not len(self.lengths) or self.lengths.max() <= most:
            return self
        lengths = np.minimum(self.lengths, most)
        return Ragged(gather(self.tokens, np.cumsum(self.lengths) - self.lengths, lengths), lengths)


def gather(tokens: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """tokens[starts[i] : starts[i] + lengths[i]] for every i, end to end."""
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    return tokens[np.repeat(starts - (ends - lengths), lengths) + np.arange(total)]


class TokenPairs(Protocol):
    """Encoded training pairs with random access."""

    def lengths(self) -> np.ndarray:
        """[pairs, 2] int32: the pieces of each pair's source and target, without eos."""

    def read(self, indices: np.ndarray) -> tuple[Ragged, Ragged]:
        """The sources and the targets of the pairs at `indices` [count], in that order."""


class TokenPairList:
    """TokenPairs over a sequence of (source pieces, target pieces), held as two flat int32 arrays (about 4 bytes a
    piece, where Python lists of the pieces take about 36)."""

    def __init__(self, pairs: Sequence[TokenPair]):
        self._sides = [Ragged.of([pair[side] for pair in pairs]) for side in (0, 1)]
        self._starts = [np.cumsum(side.lengths) - side.lengths for side in self._sides]

    def lengths(self) -> np.ndarray:
        return np.stack([side.lengths for side in self._sides], axis=1).reshape(-1, 2).astype(np.int32)

    def read(self, indices: np.ndarray) -> tuple[Ragged, Ragged]:
        source, target = (
            Ragged(gather(side.tokens, starts[indices], side.lengths[indices]), side.lengths[indices])
            for side, starts in zip(self._sides, self._starts)
        )
        return source, target
