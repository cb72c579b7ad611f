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


def attention_weights(query: jnp.ndarray, key: jnp.ndarray, mask: jnp.ndarray | None = None) -> jnp.ndarray:
    """softmax(Q K^T / sqrt(d_k)) in float32, masked before the softmax.

    query: [batch, q_len, heads, head_dim]; key: [batch, kv_len, heads, head_dim], or [batch / g, kv_len, ...]
    shared by g consecutive query rows (the hypotheses of one source in beam search, so the encoder's keys are
    stored once per source), or a decode cache block [batch / g, heads, block, length, head_dim] read by g
    consecutive query rows at one decode step (q_len 1, kv_len = block * length; MultiHeadAttention._append_to_cache);
    mask: boolean, broadcastable to [batch, heads, q_len, kv_len], True = may attend.
    Returns [batch, heads, q_len, kv_len]; a row with no allowed key is all zeros (never NaN).
    """
    head_dim = query.shape[-1]
    if key.ndim == 5:  # a decode cache block: one step, each query row against every row of its block
        groups, heads, block, length, _ = key.shape
        key = key.reshape(groups, heads, block * length, head_dim)  # free: the block is contiguous per head
        grouped = query[:, 0].reshape(groups, -1, heads, head_dim)  # [groups, g, heads, head_dim]
        scores = jnp.einsum("sghd,shkd->sghk", grouped, key, preferred_element_type=jnp.float32)
        scores = scores.reshape(query.shape[0], heads, 1, block * length)  # [rows, heads, 1, kv_len]
    elif key.shape[0] == query.shape[0]:
        scores = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32)
    else:
        grouped = query.reshape((key.shape[0], -1) + query.shape[1:])  # [sources, g, q_len, heads, head_dim]
        scores = jnp.einsum("bgqhd,bkhd->bghqk", grouped, key, preferred_element_type=jnp.float32)
        scores = scores.reshape((query.shape[0],) + scores.shape[2:])
    scores = scores / jnp.sqrt(jnp.float32(head_dim))  # [batch, heads, q_len, kv_len]
    if mask is None:
        return jax.nn.softmax(scores, axis=-1)
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.where(mask, weights, 0.0)  # fully masked rows: uniform over nothing -> zeros


def read_values(
    weights: jnp.ndarray,
    value: jnp.ndarray,
    *,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    deterministic: bool = True,
) -> jnp.ndarray:
    """Weighted sum of values, with optional dropout on the weights (not in the paper; off by default).

    weights: [batch, heads, q_len, kv_len]; value: [batch, kv_len, heads, head_dim] (or shared by groups of rows,
    or a decode cache block, as in `attention_weights`) -> [batch, q_len, heads, head_dim].
    """
    if not deterministic and dropout_rate > 0.0:
        if dropout_rng is None:
            raise ValueError("attention dropout needs dropout_rng (or deterministic=True).")
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, weights.shape)
        weights = jnp.where(keep, weights / (1.0 - dropout_rate), 0.0)
    weights = weights.astype(value.dtype)
    if value.ndim == 5:  # a decode cache block (see attention_weights)
        groups, heads, block, length, head_dim = value.shape
        value = value.reshape(groups, heads, block * length, head_dim)
        grouped = weights.reshape(groups, -1, heads, block * length)  # [groups, g, heads, kv_len] (q_len 1)
        out = jnp.einsum("sghk,shkd->sghd", grouped, value)  # [groups, g, heads, head_dim]
        return out.reshape(weights.shape[0], 1, heads, head_dim)
    if value.shape[0] == weights.shape[0]:
        return jnp.einsum("bhqk,bkhd->bqhd", weights, value)
    grouped = weights.reshape((value.shape[0], -1) + weights.shape[1:])  # [sources, g, heads, q_len, kv_len]
    out = jnp.einsum("bghqk,bkhd->bgqhd", grouped, value)
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
        is_self_attention = inputs_kv is None
        query = self._projection("query")(inputs_q)  # [batch, q_len, heads, head_dim]
        if decode and inputs_kv is not None:  # cross-attention
            key, value = self._cached_memory(inputs_kv)
        else:
            source = inputs_q if is_self_attention else inputs_kv
            key = self._projection("key")(source)  # [batch, kv_len, heads, head_dim]
            value = self._projection("value")(source)
            if decode:
                key, value, mask = self._append_to_cache(key, value, mask)
        dropout_rng = None
        if not deterministic and cfg.attention_dropout_rate > 0.0:
            dropout_rng = self.make_rng("dropout")
        weights = attention_weights(query, key, mask)  # [batch, heads, q_len, kv_len]
        self.sow("intermediates", "attention_weights", weights)  # for attention maps (visualize.py)
        attended = read_values(
            weights,
            value,
            dropout_rate=cfg.attention_dropout_rate,
            dropout_rng=dropout_rng,
            deterministic=deterministic,
        )  # [batch, q_len, heads, head_dim]
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
        """Cross-attention keys/values of the encoder output, projected on the first call only."""
        if self.has_variable("cache", "memory_key"):
            return self.get_variable("cache", "memory_key"), self.get_variable("cache", "memory_value")
        key = self._projection("key")(memory)  # [batch, src_len, heads, head_dim]
        value = self._projection("value")(memory)
        self.put_variable("cache", "memory_key", key)
        self.put_variable("cache", "memory_value", value)
        return key, value

    def _append_to_cache(self, key, value, mask):
        """Self-attention decode step: write this step's key/value at the cache index.

        The cache is a block [groups, heads, block, max_length, head_dim] read by `block` consecutive query rows
        per group: block 1 (one row per sequence) unless decoding/cache.with_lineage made it a beam search block.
        Heads-major, so the step's attention is two batched dots over the cache as stored (no per-step copy).
        The first call (cache initialisation) sees the full-length target and only sizes the cache.
        """
        is_initialized = self.has_variable("cache", "cached_key")
        rows, max_length, heads, head_dim = key.shape
        block_shape = (rows, heads, 1, max_length, head_dim)  # [groups, heads, block, max_length, head_dim]
        cached_key = self.variable("cache", "cached_key", jnp.zeros, block_shape, key.dtype)
        cached_value = self.variable("cache", "cached_value", jnp.zeros, block_shape, value.dtype)
        cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, dtype=jnp.int32))
        if not is_initialized:
            return key, value, mask
        groups, _, block, max_length, _ = cached_key.value.shape
        index = cache_index.value

        def write(cache, new):  # new: [rows, 1, heads, head_dim] -> [groups, heads, block, 1, head_dim] at index
            new = jnp.swapaxes(new[:, 0].reshape(groups, block, heads, head_dim), 1, 2)[:, :, :, None]
            return lax.dynamic_update_slice(cache, new.astype(cache.dtype), (0, 0, 0, index, 0))

        cached_key.value = write(cached_key.value, key)
        cached_value.value = write(cached_value.value, value)
        cache_index.value = index + 1
        filled = jnp.arange(max_length) <= index  # [max_length]
        if not self.has_variable("cache", "lineage"):
            return cached_key.value, cached_value.value, combine_masks(mask, filled[None, None, None, :])
        if mask is not None:  # a mask over positions applies in whichever row of the block the position is
            mask = jnp.tile(mask, (1,) * (mask.ndim - 1) + (block,))
        return cached_key.value, cached_value.value, combine_masks(mask, self._lineage_mask(filled, index))

    def _lineage_mask(self, filled, index):
        """Beam search without moving the cache (decoding/cache.py: with_lineage).

        Rows keep the keys/values they computed; `lineage` [sources, beam, max_length] says, for the hypothesis
        now in row j of a source's block of `beam` rows, which row of the block holds its position s. Each
        hypothesis reads all keys of its block, masked to its own positions: beam times the (small) attention
        reads of a decode step instead of copying the whole cache at every step. Returns the mask
        [rows, 1, 1, beam * max_length] over the block's keys.
        """
        lineage = self.get_variable("cache", "lineage")  # [sources, beam, max_length]
        sources, beam, max_length = lineage.shape
        own_rows = jnp.broadcast_to(jnp.arange(beam, dtype=lineage.dtype)[None, :, None], (sources, beam, 1))
        lineage = lax.dynamic_update_slice(lineage, own_rows, (0, 0, index))  # this step's key/value: its own row
        self.put_variable("cache", "lineage", lineage)
        holds = lineage[:, :, None, :] == jnp.arange(beam)[None, None, :, None]  # [sources, beam, beam, max_length]
        return (holds & filled).reshape(sources * beam, 1, 1, beam * max_length)
