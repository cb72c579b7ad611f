"""Scaled dot-product attention (§3.2.1) and multi-head attention with a decode cache (§3.2.2)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from transformer_jax.config import ModelConfig
from transformer_jax.layers.init import bias_init, kernel_init
from transformer_jax.layers.linear import dense_dot_general
from transformer_jax.layers.masks import combine_masks


def _masked_softmax(scores: jnp.ndarray, mask: jnp.ndarray | None) -> jnp.ndarray:
    """Softmax over the last axis of float32 scores; masked entries get weight 0, a fully masked row all zeros."""
    if mask is None:
        return jax.nn.softmax(scores, axis=-1)
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.where(mask, weights, 0.0)  # fully masked rows: uniform over nothing -> zeros


def attention_weights(query: jnp.ndarray, key: jnp.ndarray, mask: jnp.ndarray | None = None) -> jnp.ndarray:
    """softmax(Q K^T / sqrt(d_k)) in float32, masked before the softmax.

    query: [batch, q_len, heads, head_dim]; key: [batch, kv_len, heads, head_dim];
    mask: boolean, broadcastable to [batch, heads, q_len, kv_len], True = may attend.
    Returns [batch, heads, q_len, kv_len]; a row with no allowed key is all zeros (never NaN).
    """
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32)
    return _masked_softmax(scores / jnp.sqrt(jnp.float32(query.shape[-1])), mask)


def cached_attention_weights(query: jnp.ndarray, key: jnp.ndarray, mask: jnp.ndarray | None = None) -> jnp.ndarray:
    """attention_weights against a decode cache in heads-major order.

    query: [rows, q_len, heads, head_dim] (q_len 1 at a decode step); key: [groups, heads, kv_len, head_dim], read
    by g = rows / groups consecutive query rows (g > 1: the hypotheses of one source in beam search share its
    encoder keys and its block of self-attention keys, decoding/cache.py). Heads-major keys make a decode step one
    batched dot over the cache as stored. mask: broadcastable to [rows, heads, q_len, kv_len].
    Returns [rows, heads, q_len, kv_len].
    """
    groups, heads, kv_len, head_dim = key.shape
    grouped = query.reshape((groups, -1) + query.shape[1:])  # [groups, g, q_len, heads, head_dim]
    scores = jnp.einsum("sgqhd,shkd->sghqk", grouped, key, preferred_element_type=jnp.float32)
    scores = scores.reshape(query.shape[0], heads, query.shape[1], kv_len)  # [rows, heads, q_len, kv_len]
    return _masked_softmax(scores / jnp.sqrt(jnp.float32(head_dim)), mask)


def _attention_dropout(weights, dropout_rate, dropout_rng, deterministic):
    """Dropout on the attention weights (not in the paper; off by default)."""
    if deterministic or dropout_rate == 0.0:
        return weights
    if dropout_rng is None:
        raise ValueError("attention dropout needs dropout_rng (or deterministic=True).")
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
    return jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)


def read_values(
    weights: jnp.ndarray,
    value: jnp.ndarray,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    deterministic: bool = True,
) -> jnp.ndarray:
    """Weighted sum of values, with optional dropout on the weights (not in the paper; off by default).

    weights: [batch, heads, q_len, kv_len]; value: [batch, kv_len, heads, head_dim] -> [batch, q_len, heads, head_dim].
    """
    weights = _attention_dropout(weights, dropout_rate, dropout_rng, deterministic).astype(value.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, value)


def read_cached_values(weights: jnp.ndarray, value: jnp.ndarray) -> jnp.ndarray:
    """read_values against a decode cache: weights [rows, heads, q_len, kv_len] from cached_attention_weights,
    value [groups, heads, kv_len, head_dim] (heads-major, shared by rows / groups consecutive rows)
    -> [rows, q_len, heads, head_dim]."""
    groups, heads, kv_len, head_dim = value.shape
    grouped = weights.astype(value.dtype).reshape((groups, -1) + weights.shape[1:])  # [groups, g, heads, q, kv]
    out = jnp.einsum("sghqk,shkd->sgqhd", grouped, value)  # [groups, g, q_len, heads, head_dim]
    return out.reshape((weights.shape[0],) + out.shape[2:])


def dot_product_attention(
    query: jnp.ndarray,
    key: jnp.ndarray,
    value: jnp.ndarray,
    mask: jnp.ndarray | None = None,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    deterministic: bool = True,
) -> jnp.ndarray:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V, as a pure function.

    query: [batch, q_len, heads, head_dim]; key, value: [batch, kv_len, heads, head_dim].
    Returns [batch, q_len, heads, head_dim] in the value's dtype.
    """
    return read_values(
        attention_weights(query, key, mask),
        value,
        dropout_rate=dropout_rate,
        dropout_rng=dropout_rng,
        deterministic=deterministic,
    )


class MultiHeadAttention(nn.Module):
    """h parallel heads of width d_k = d_model / h with separate Q, K, V, O projections (§3.2.2).

    `attn(x)` is self-attention, `attn(x, memory)` is cross-attention. With `decode=True`, self-attention
    appends this step's key/value to a cache of the full decode length, and cross-attention projects the
    memory's keys/values once and reuses them at every later step ('cache' collection). The attention
    weights are sown into the 'intermediates' collection when it is mutable.
    """

    config: ModelConfig

    def _projection(self, name: str) -> nn.DenseGeneral:
        cfg = self.config
        return nn.DenseGeneral(
            features=(cfg.num_heads, cfg.head_dim),
            use_bias=cfg.attention_bias,
            name=name,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            dot_general=dense_dot_general,
            kernel_init=kernel_init(("embed", "heads", "kv")),
            bias_init=bias_init(("heads", "kv")),
        )

    @nn.compact
    def __call__(
        self,
        inputs_q: jnp.ndarray,
        inputs_kv: jnp.ndarray | None = None,
        mask: jnp.ndarray | None = None,
        deterministic: bool = True,
        decode: bool = False,
    ) -> jnp.ndarray:
        cfg = self.config
        query = self._projection("query")(inputs_q)  # [batch, q_len, heads, head_dim]
        if decode:  # keys/values from the cache, heads-major [groups, heads, kv_len, head_dim]; no dropout
            if inputs_kv is None:
                key, value, mask = self._append_to_cache(inputs_q, mask)
            else:
                key, value = self._cached_memory(inputs_kv)
            weights = cached_attention_weights(query, key, mask)  # [batch, heads, q_len, kv_len]
            attended = read_cached_values(weights, value)  # [batch, q_len, heads, head_dim]
        else:
            source = inputs_q if inputs_kv is None else inputs_kv
            key = self._projection("key")(source)  # [batch, kv_len, heads, head_dim]
            value = self._projection("value")(source)
            dropout_rng = None
            if not deterministic and cfg.attention_dropout_rate > 0.0:
                dropout_rng = self.make_rng("dropout")
            weights = attention_weights(query, key, mask)  # [batch, heads, q_len, kv_len]
            attended = read_values(
                weights,
                value,
                dropout_rate=cfg.attention_dropout_rate,
                dropout_rng=dropout_rng,
                deterministic=deterministic,
            )  # [batch, q_len, heads, head_dim]
        self.sow("intermediates", "attention_weights", weights)  # for attention maps (visualize.py)
        return nn.DenseGeneral(
            features=cfg.d_model,
            axis=(-2, -1),
            use_bias=cfg.attention_bias,
            name="out",
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            dot_general=dense_dot_general,
            kernel_init=kernel_init(("heads", "kv", "embed")),
            bias_init=bias_init(("embed",)),
        )(attended)  # [batch, q_len, d_model]

    def _cached_memory(self, memory: jnp.ndarray):
        """Cross-attention keys/values of the encoder output [sources, heads, src_len, head_dim], projected on the
        first call only."""
        if not self.has_variable("cache", "memory_key"):
            for name in ("key", "value"):
                projected = self._projection(name)(memory)  # [sources, src_len, heads, head_dim]
                self.put_variable("cache", f"memory_{name}", jnp.swapaxes(projected, 1, 2))
        return self.get_variable("cache", "memory_key"), self.get_variable("cache", "memory_value")

    def _append_to_cache(self, inputs, mask):
        """Self-attention decode step: project this step's key/value, write them at the cache index and return
        the cache [groups, heads, max_length * block, head_dim] with the mask over it.

        Each group's `block` consecutive query rows share one block of keys, position-major (the key of position t
        written by row k of the block sits at t * block + k): block 1 (one row per sequence) unless
        decoding/cache.with_lineage made it a beam search block. The first call (cache initialisation) sees the
        full-length target and only sizes the cache; its output is not meaningful.
        """
        key = self._projection("key")(inputs)  # [rows, q_len, heads, head_dim]
        value = self._projection("value")(inputs)
        key, value = jnp.swapaxes(key, 1, 2), jnp.swapaxes(value, 1, 2)  # [rows, heads, q_len, head_dim]
        if not self.has_variable("cache", "cached_key"):
            self.variable("cache", "cached_key", jnp.zeros, key.shape, key.dtype)
            self.variable("cache", "cached_value", jnp.zeros, value.shape, value.dtype)
            self.variable("cache", "cache_index", lambda: jnp.array(0, dtype=jnp.int32))
            return key, value, mask
        cached_key, cached_value = self.variable("cache", "cached_key"), self.variable("cache", "cached_value")
        cache_index = self.variable("cache", "cache_index")
        groups, heads, _, head_dim = cached_key.value.shape
        block = self.get_variable("cache", "lineage").shape[1] if self.has_variable("cache", "lineage") else 1
        index = cache_index.value

        def write(cache, new):  # new: [rows, heads, 1, head_dim] -> positions index * block ... + block - 1
            new = jnp.swapaxes(new[:, :, 0].reshape(groups, block, heads, head_dim), 1, 2)  # [groups, heads, block, d]
            return lax.dynamic_update_slice(cache, new.astype(cache.dtype), (0, 0, index * block, 0))

        cached_key.value = write(cached_key.value, key)
        cached_value.value = write(cached_value.value, value)
        cache_index.value = index + 1
        max_length = cached_key.value.shape[2] // block
        filled = jnp.arange(max_length) <= index  # [max_length]
        if block == 1:
            return cached_key.value, cached_value.value, combine_masks(mask, filled[None, None, None, :])
        if mask is not None:  # a mask over positions applies in whichever row of the block holds the position
            mask = jnp.repeat(mask, block, axis=-1)
        return cached_key.value, cached_value.value, combine_masks(mask, self._lineage_mask(filled, index))

    def _lineage_mask(self, filled, index):
        """Beam search without moving the cache (decoding/cache.py: with_lineage).

        Rows keep the keys/values they computed; `lineage` [sources, beam, max_length] says, for the hypothesis
        now in row j of a source's block of `beam` rows, which row of the block holds its position s. Each
        hypothesis reads all keys of its block, masked to its own positions: beam times the (small) attention
        reads of a decode step instead of copying the whole cache at every step. Returns the mask
        [rows, 1, 1, max_length * beam] over the block's keys (position-major, as _append_to_cache stores them).
        """
        lineage = self.get_variable("cache", "lineage")  # [sources, beam, max_length]
        sources, beam, max_length = lineage.shape
        own_rows = jnp.broadcast_to(jnp.arange(beam, dtype=lineage.dtype)[None, :, None], (sources, beam, 1))
        lineage = lax.dynamic_update_slice(lineage, own_rows, (0, 0, index))  # this step's key/value: its own row
        self.put_variable("cache", "lineage", lineage)
        holds = lineage[:, :, :, None] == jnp.arange(beam)  # [sources, beam (row j), max_length, beam (row k)]
        return (holds & filled[:, None]).reshape(sources * beam, 1, 1, max_length * beam)
