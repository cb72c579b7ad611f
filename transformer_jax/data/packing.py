"""Greedy first-fit packing of several (source, target) pairs into rows of one fixed length."""

from __future__ import annotations

import numpy as np

Row = list[int]  # indices of the examples placed in one row, in order


def pack_rows(
    order: np.ndarray, source_lengths: np.ndarray, target_lengths: np.ndarray, row_length: int, rows_per_batch: int
) -> list[list[Row]]:
    """Groups the examples `order` (in that order) into batches of at most `rows_per_batch` rows.

    Each example goes into the first row of the current batch where both its source and its target still
    fit in `row_length` tokens; if none has room and the batch is full, the batch is closed and a new one
    begins. Every example lands in exactly one row; lengths must be ≤ row_length.
    """
    batches: list[list[Row]] = []
    rows: list[Row] = []
    source_used = np.zeros(rows_per_batch, np.int64)  # [rows_per_batch] tokens taken in each row
    target_used = np.zeros(rows_per_batch, np.int64)
    for index in order:
        source_length, target_length = source_lengths[index], target_lengths[index]
        fits = np.flatnonzero(
            (source_used[: len(rows)] + source_length <= row_length)
            & (target_used[: len(rows)] + target_length <= row_length)
        )
        if fits.size:
            row = int(fits[0])
        else:
            if len(rows) == rows_per_batch:
                batches.append(rows)
                rows = []
                source_used[:] = 0
                target_used[:] = 0
            row = len(rows)
            rows.append([])
        rows[row].append(int(index))
        source_used[row] += source_length
        target_used[row] += target_length
    if rows:
        batches.append(rows)
    return batches
