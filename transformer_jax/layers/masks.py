"""Attention masks. Convention: boolean, broadcastable to [batch, heads, q_len, kv_len], True = may attend."""

from __future__ import annotations

import jax.numpy as jnp


def padding_mask(q_tokens: jnp.ndarray, kv_tokens: jnp.ndarray, pad_id: int) -> jnp.ndarray:
    """[batch, 1, q_len, kv_len]: both the query and the key are real tokens."""
    return real_mask(q_tokens != pad_id, kv_tokens != pad_id)


def real_mask(q_real: jnp.ndarray, kv_real: jnp.ndarray) -> jnp.ndarray:
    """[batch, 1, q_len, kv_len] from q_real [batch, q_len] and kv_real [batch, kv_len]: both are real tokens."""
    return q_real[:, None, :, None] & kv_real[:, None, None, :]


def causal_mask(length: int) -> jnp.ndarray:
    """[1, 1, length, length]: position i sees positions <= i (§3.2.3)."""
    positions = jnp.arange(length)
    return (positions[None, :] <= positions[:, None])[None, None]


def segment_mask(q_segments: jnp.ndarray, kv_segments: jnp.ndarray) -> jnp.ndarray:
    """[batch, 1, q_len, kv_len]: query and key belong to the same packed pair (segment ids, 0 = padding)."""
    return q_segments[:, None, :, None] == kv_segments[:, None, None, :]


def combine_masks(*masks) -> jnp.ndarray | None:
    """Logical AND of the masks that are not None (None if all are)."""
    present = [mask for mask in masks if mask is not None]
    if not present:
        return None
    combined = present[0]
    for mask in present[1:]:
        combined = combined & mask
    return combined
