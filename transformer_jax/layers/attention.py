"""Scaled dot-product attention (§3.2.1) and multi-head attention with a decode cache (§3.2.2)."""

from __future__ import annotations

import typing

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.config import ModelConfig
from transformer_jax.errors import UserError
from transformer_jax.layers.init import bias_init, kernel_init
from transformer_jax.layers.kv_cache import KVCache, MemoryCache
from transformer_jax.layers.linear import dense_dot_general


def _masked_softmax(scores: jnp.ndarray, mask: jnp.ndarray | None) -> jnp.ndarray:
    """Softmax over the last axis of float32 scores; masked entries get weight 0, a fully masked row all zeros."""
    if mask is None:
        return jax.nn.softmax(scores, axis=-1)
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1)
    return jnp.where(mask, weights, 0.0)  # fully masked rows: uniform over nothing -> zeros


def attention_weights(query: jnp.ndarray, key: jnp.ndarray, mask: jnp.ndarray | None = None) -> jnp.ndarray:
    """softmax(Q K^T / sqrt(d_k)) in float32, masked before the softmax.

    query: [batch, q_len, heads, d_k]; key: [batch, kv_len, heads, d_k];
    mask: boolean, broadcastable to [batch, heads, q_len, kv_len], True = may attend.
    Returns [batch, heads, q_len, kv_len]; a row with no allowed key is all zeros (never NaN).
    """
    scores = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32)
    return _masked_softmax(scores / jnp.sqrt(jnp.float32(query.shape[-1])), mask)


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

    weights: [batch, heads, q_len, kv_len]; value: [batch, kv_len, heads, d_v] -> [batch, q_len, heads, d_v].
    """
    weights = _attention_dropout(weights, dropout_rate, dropout_rng, deterministic).astype(value.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, value)


def cached_attention(query: jnp.ndarray, key: jnp.ndarray, value: jnp.ndarray, mask: jnp.ndarray | None) -> jnp.ndarray:
    """Attention(Q, K, V) against a decode cache in heads-major order.

    query: [rows, q_len, heads, d_k] (q_len 1 at a decode step); key: [groups, heads, kv_len, d_k] and value
    [groups, heads, kv_len, d_v], read by g = rows / groups consecutive query rows (g > 1: rows that share one group
    of cached keys, layers/kv_cache.py). mask: broadcastable to [rows, heads, q_len, kv_len].
    Returns [rows, q_len, heads, d_v]. Scores and outputs are laid out batch dimensions first ([groups, heads, g,
    q_len, ..]), so that both products are batched dots over the cache as stored: with the query rows between the
    batch dimensions of the value product's output, XLA:CPU ran it 13x slower at g = 4, 1 query, 264 keys.
    """
    groups, heads, kv_len, d_k = key.shape
    rows, q_len = query.shape[:2]
    if key.dtype != jnp.float32 and jax.default_backend() == "cpu":
        # XLA:CPU of jaxlib 0.7 has no bf16 x bf16 -> f32 kernel for this dot; bf16 products are exact in float32,
        # so upcasting the operands gives the same scores (and XLA:CPU upcasts bf16 dots anyway).
        query, key = query.astype(jnp.float32), key.astype(jnp.float32)
    grouped = query.reshape((groups, -1) + query.shape[1:])  # [groups, g, q_len, heads, d_k]
    scores = jnp.einsum("sgqhd,shkd->shgqk", grouped, key, preferred_element_type=jnp.float32)
    if mask is not None:
        mask = jnp.broadcast_to(mask, (rows,) + mask.shape[1:3] + (kv_len,))  # [rows, 1 | heads, 1 | q_len, kv_len]
        mask = jnp.swapaxes(mask.reshape((groups, -1) + mask.shape[1:]), 1, 2)  # [groups, 1 | heads, g, .., kv_len]
    weights = _masked_softmax(scores / jnp.sqrt(jnp.float32(d_k)), mask)  # [groups, heads, g, q_len, kv_len]
    out = jnp.einsum("shgqk,shkd->shgqd", weights.astype(value.dtype), value)  # [groups, heads, g, q_len, d_v]
    return jnp.transpose(out, (0, 2, 3, 1, 4)).reshape((rows, q_len, heads, value.shape[-1]))


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

    query, key: [batch, q_len | kv_len, heads, d_k]; value: [batch, kv_len, heads, d_v].
    Returns [batch, q_len, heads, d_v] in the value's dtype.
    """
    return read_values(
        attention_weights(query, key, mask),
        value,
        dropout_rate=dropout_rate,
        dropout_rng=dropout_rng,
        deterministic=deterministic,
    )


class AttentionKernelError(UserError, ValueError):
    """A fused attention kernel cannot run on this machine."""


def check_cudnn_attention(head_dim: int, device: jax.Device | None = None) -> None:
    """cuDNN's fused attention needs an NVIDIA GPU and head_dim <= 128 (256 from compute capability 9.0, Hopper);
    ModelConfig checks the rest (bfloat16/float16, head_dim % 8, no attention dropout)."""
    device = jax.devices()[0] if device is None else device
    if device.platform != "gpu":
        raise AttentionKernelError(
            f"attention_impl='cudnn' needs an NVIDIA GPU, but JAX runs on {device.platform} ({device.device_kind}); "
            "use attention_impl='xla' or 'einsum' here."
        )
    capability = float(getattr(device, "compute_capability", "0") or 0)
    limit = 256 if capability >= 9.0 else 128
    if head_dim > limit:
        raise AttentionKernelError(
            f"attention_impl='cudnn' needs head_dim <= {limit} on {device.device_kind} (compute capability "
            f"{capability}), not {head_dim}; use more heads or attention_impl='xla'."
        )


def fused_attention(
    query: jnp.ndarray, key: jnp.ndarray, value: jnp.ndarray, mask: jnp.ndarray | None, implementation: str
) -> jnp.ndarray:
    """`jax.nn.dot_product_attention` with implementation 'xla' or 'cudnn' (checked before it compiles).

    query: [batch, q_len, heads, head_dim]; key, value: [batch, kv_len, heads, head_dim] (the kernel needs
    d_k = d_v = head_dim; ModelConfig checks it); mask: boolean,
    broadcastable to [batch, heads, q_len, kv_len]. Returns [batch, q_len, heads, head_dim]. A query row with no
    allowed key gets the mean of the values here (the einsum path gives zeros); such rows are padding.
    """
    if implementation == "cudnn":
        check_cudnn_attention(query.shape[-1])
    if mask is not None:
        mask = jnp.broadcast_to(mask, (query.shape[0], query.shape[2], query.shape[1], key.shape[1]))
    kernel = typing.cast(typing.Literal["xla", "cudnn"], implementation)
    return jax.nn.dot_product_attention(query, key, value, mask=mask, implementation=kernel)


class MultiHeadAttention(nn.Module):
    """h parallel heads with separate Q, K, V, O projections (§3.2.2): queries and keys of d_k per head, values of
    d_v (config.d_k, config.d_v; both d_model / h unless key_dim / value_dim say otherwise).

    `attn(x)` is self-attention, `attn(x, memory)` is cross-attention. With `decode=True` the keys/values live in
    the 'cache' collection (layers/kv_cache.py): self-attention appends this step's key/value to a KVCache of the
    full decode length, whose `cache_block` consecutive rows share one group of keys (set when the first call
    makes the cache); cross-attention projects the memory's keys/values once into a MemoryCache and reuses them
    at every later step. The attention weights are sown into the 'intermediates' collection when it is mutable.
    """

    config: ModelConfig

    def _projection(self, name: str) -> nn.DenseGeneral:
        """The query/key ([embed, heads, d_k]) or value ([embed, heads, d_v]) projection."""
        cfg = self.config
        return nn.DenseGeneral(
            features=(cfg.num_heads, cfg.d_v if name == "value" else cfg.d_k),
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
        cache_block: int = 1,
    ) -> jnp.ndarray:
        cfg = self.config
        query = self._projection("query")(inputs_q)  # [batch, q_len, heads, d_k]
        if decode:  # keys/values from the cache, heads-major [groups, heads, kv_len, d_k | d_v]; no dropout
            if inputs_kv is None:
                key, value, mask = self._append_to_cache(inputs_q, mask, cache_block)
            else:
                key, value = self._cached_memory(inputs_kv)
            attended = cached_attention(query, key, value, mask)  # [batch, q_len, heads, d_v]
            weights = None
        else:
            source = inputs_q if inputs_kv is None else inputs_kv
            key = self._projection("key")(source)  # [batch, kv_len, heads, d_k]
            value = self._projection("value")(source)  # [batch, kv_len, heads, d_v]
            if cfg.attention_impl == "einsum":
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
                )  # [batch, q_len, heads, d_v]
            else:  # a fused kernel: no weights to show
                attended = fused_attention(query, key, value, mask, cfg.attention_impl)
                weights = None
        if weights is not None:
            self.sow("intermediates", "attention_weights", weights)  # for attention maps (visualize.py)
        return nn.DenseGeneral(
            features=cfg.d_model,
            axis=(-2, -1),
            use_bias=cfg.attention_bias,
            name="out",
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            dot_general=dense_dot_general,
            kernel_init=kernel_init(("heads", "kv", "embed")),  # [heads, d_v, embed]
            bias_init=bias_init(("embed",)),
        )(attended)  # [batch, q_len, d_model]

    def _projected(self, name: str, inputs: jnp.ndarray) -> jnp.ndarray:
        """Heads-major key or value projection: [batch, length, d_model] -> [batch, heads, length, d_k | d_v]."""
        return jnp.swapaxes(self._projection(name)(inputs), 1, 2)

    def _cached_memory(self, memory: jnp.ndarray):
        """Cross-attention keys [sources, heads, src_len, d_k] and values [.., d_v] of the encoder output, projected
        on the first call only."""
        cache = self.variable(
            "cache", "memory", lambda: MemoryCache(self._projected("key", memory), self._projected("value", memory))
        )
        return cache.value.key, cache.value.value

    def _append_to_cache(self, inputs, mask, cache_block: int):
        """Self-attention decode step: writes this step's key/value into the KVCache and returns its keys/values
        [groups, heads, kv_len, d_k | d_v] with the mask over them (`mask`, the decoder's Lineage.advance, or the
        slots written so far).

        The first call (cache initialisation) sees the full-length target and only sizes the cache; its output is
        not meaningful.
        """
        key, value = self._projected("key", inputs), self._projected("value", inputs)  # [rows, heads, q_len, d_k|d_v]
        if not self.has_variable("cache", "keys_values"):
            rows, heads, max_len, key_dim = key.shape
            empty = KVCache.empty(rows, heads, max_len, key_dim, value.shape[-1], key.dtype, cache_block)
            self.put_variable("cache", "keys_values", empty)
            return key, value, mask
        cache: nn.Variable[KVCache] = self.variable("cache", "keys_values")
        cache.value, mask = cache.value.append(key, value, mask)
        return cache.value.key, cache.value.value, mask
