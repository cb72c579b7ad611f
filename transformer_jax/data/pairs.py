"""What every parallel-text source shares: split names, the (source, target) pair, and the pair filter.

A source is any object with `source_lang`, `target_lang` and `pairs(split) -> Iterator[Pair]`
(`ParallelSource`). Sources that drop pairs keep a `SkipCounts` per split in `source.skipped[split]`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator
from typing import Protocol

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")

Pair = tuple[str, str]  # (source text, target text)


class ParallelSource(Protocol):
    source_lang: str
    target_lang: str

    def pairs(self, split: str) -> Iterator[Pair]:
        """Yields the (source, target) pairs of `split`, one of SPLITS, in a fixed order."""


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; use one of {SPLITS}.")


@dataclasses.dataclass
class SkipCounts:
    """How many pairs of one split were kept, and why the others were dropped."""

    kept: int = 0
    empty: int = 0  # source or target empty (after stripping whitespace)
    too_long: int = 0  # source or target longer than max_chars characters


def filter_pairs(pairs: Iterable[Pair], max_chars: int | None, counts: SkipCounts, name: str) -> Iterator[Pair]:
    """Strips whitespace around each side, then drops empty pairs and pairs with a side over `max_chars`.

    Updates `counts` as it goes and logs them (INFO) once `pairs` is exhausted.
    """
    for source, target in pairs:
        source, target = source.strip(), target.strip()
        if not source or not target:
            counts.empty += 1
        elif max_chars is not None and max(len(source), len(target)) > max_chars:
            counts.too_long += 1
        else:
            counts.kept += 1
            yield source, target
    logger.info(
        "%s: kept %d pairs, skipped %d with an empty side and %d with a side over %s characters.",
        name,
        counts.kept,
        counts.empty,
        counts.too_long,
        max_chars,
    )
