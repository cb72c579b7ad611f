"""What a search knows of each sentence besides its source: a length limit, a stable id, a forced target prefix.

The searches (greedy.py, beam.py, sampling.py) take `Sentences` at every step; every array has the sentences as its
leading axis, so that the driver drops finished sentences from it as from the search state.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np


class Sentences(NamedTuple):
    limits: jnp.ndarray  # [batch] int32: output length limit, EOS counted (§6.1: source length + 50)
    ids: jnp.ndarray  # [batch] int32: the sentence's id in its corpus, which seeds a sampling search
    prefix: jnp.ndarray  # [batch, prefix_width] int32: tokens each output must start with, pad after them; width 0
    # when no sentence has one (the searches then trace no forcing at all)
    prefix_lengths: jnp.ndarray  # [batch] int32: how many of `prefix` are forced (0: none)

    def forced(self, step: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        """(forcing [batch] bool, token [batch]): whether output position `step` is given by the prefix, and which."""
        batch, width = self.prefix.shape
        if width == 0:  # constants: XLA drops the selects they feed
            return jnp.zeros((batch,), bool), jnp.zeros((batch,), jnp.int32)
        return step < self.prefix_lengths, self.prefix[:, jnp.minimum(step, width - 1)]


def plain_sentences(limits: jnp.ndarray) -> Sentences:
    """Sentences with `limits` [batch], ids 0 .. batch-1 and no prefix."""
    batch = limits.shape[0]
    return Sentences(
        limits=limits,
        ids=jnp.arange(batch, dtype=jnp.int32),
        prefix=jnp.zeros((batch, 0), jnp.int32),  # [batch, 0]
        prefix_lengths=jnp.zeros((batch,), jnp.int32),
    )


def pad_prefixes(prefixes: list[list[int]], rows: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(prefix [rows, width], lengths [rows]) of token lists (rows beyond them: no prefix); width 0 without any."""
    width = max([0, *map(len, prefixes)])
    prefix = np.full((rows, width), pad_id, np.int32)  # [rows, width]
    lengths = np.zeros((rows,), np.int32)
    for row, tokens in enumerate(prefixes):
        prefix[row, : len(tokens)] = tokens
        lengths[row] = len(tokens)
    return prefix, lengths
