"""Choosing tokens from logits: the exact argmax, top-k and log-softmax normaliser, with few vector passes.

XLA:CPU runs `jnp.argmax` (a variadic (value, index) reduce) as a scalar loop and `lax.top_k` over a vocabulary as
a per-row partial sort; at a decode step over [rows, vocab] logits these took as long as the vocabulary matmul
(experiments/bench/profile_decode.py). Both functions here return exactly what those do, ties included (the lowest
index first), from max / min reductions that fuse and vectorise. `log_normaliser` is jax.nn.logsumexp given the
row maximum that the argmax or top-k has already found, which saves a pass over the vocabulary.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

TOP_K_CHUNK = 64  # vocabulary entries per chunk of the two-stage top-k


def first_argmax(x: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(max over the last axis, the lowest index holding it) = (jnp.max, jnp.argmax) for NaN-free x."""
    best = jnp.max(x, axis=-1, keepdims=True)
    index = jnp.min(jnp.where(x == best, jnp.arange(x.shape[-1], dtype=jnp.int32), x.shape[-1]), axis=-1)
    return best[..., 0], index


def top_k(x: jnp.ndarray, k: int, chunk: int = TOP_K_CHUNK) -> tuple[jnp.ndarray, jnp.ndarray]:
    """lax.top_k(x, k) over the last axis (values, int32 indices; equal values in index order), in two stages.

    The vocabulary is cut into chunks of `chunk` entries. The k best entries lie in the k chunks with the best
    maxima (were an entry in another chunk, those k chunks' maxima would be k entries ranked ahead of it: greater,
    or equal and at a lower index, since top_k keeps the lower-indexed of equal chunks), so a top-k over the chunk
    maxima, then one over the k * chunk entries of those chunks (taken in index order, so that ties resolve as in
    one top-k) gives the exact result.
    """
    n = x.shape[-1]
    chunks = -(-n // chunk)
    if chunks <= k:
        return lax.top_k(x, k)
    padded = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, chunks * chunk - n)], constant_values=-jnp.inf)
    blocks = padded.reshape(x.shape[:-1] + (chunks, chunk))  # [..., chunks, chunk]
    _, best_chunks = lax.top_k(jnp.max(blocks, axis=-1), k)  # [..., k]
    best_chunks = jnp.sort(best_chunks, axis=-1)  # index order
    candidates = jnp.take_along_axis(blocks, best_chunks[..., None], axis=-2)  # [..., k, chunk]
    values, position = lax.top_k(candidates.reshape(x.shape[:-1] + (k * chunk,)), k)  # [..., k]
    chunk_of = jnp.take_along_axis(best_chunks, position // chunk, axis=-1)
    return values, (chunk_of * chunk + position % chunk).astype(jnp.int32)


def log_normaliser(logits: jnp.ndarray, row_max: jnp.ndarray) -> jnp.ndarray:
    """log(sum(exp(logits))) over the last axis given row_max = max(logits, -1): jax.nn.logsumexp's own formula
    (a non-finite maximum counts as 0) without its max pass. Returns [...]."""
    row_max = jnp.where(jnp.isfinite(row_max), row_max, 0.0)[..., None]
    return (jnp.log(jnp.sum(jnp.exp(logits - row_max), axis=-1, keepdims=True)) + row_max)[..., 0]
