"""The decode cache of a Transformer as a pytree: creating it, stepping with it, reordering and sharding it.

Layout (Flax 'cache' collection; types from kv_cache.py):
  decoder/lineage                              Lineage       rows [groups, block, max_decode_len], index []: the
                                                             next position and which key slots each row reads
  decoder/layer_i/self_attention/keys_values   KVCache       keys/values [groups, heads, max_decode_len * block,
                                                             d_k | d_v], index []
  decoder/layer_i/cross_attention/memory       MemoryCache   keys/values [sources, heads, src_len, d_k | d_v],
                                                             once per source

Greedy search decodes one row per group (block 1); beam search puts each source's `beam` hypotheses in one group
(block beam, `init_cache(..., beam_size=)`), so that reordering them moves only the lineage, once for all layers.

A step function `step_fn(tokens [n], cache) -> (logits [n, vocab] float32, cache)` is what the searches
in greedy.py and beam.py consume; they never look inside the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from transformer_jax import parallel
from transformer_jax.decoding.kv_cache import KVCache, Lineage, MemoryCache, gather_rows

Cache = Any
StepFn = Callable[[jnp.ndarray, Cache], tuple[jnp.ndarray, Cache]]


def as_params(params):
    """Accepts `params`, `{'params': params}`, boxed (nn.with_logical_partitioning) or plain; returns plain."""
    params = nn.unbox(params)
    if (isinstance(params, dict) or hasattr(params, "keys")) and set(params.keys()) == {"params"}:
        params = params["params"]
    return params


def encode(model: nn.Module, params, inputs: jnp.ndarray) -> jnp.ndarray:
    """The encoder output [batch, src_len, d_model] of `inputs` [batch, src_len], once per source sentence."""
    return cast(jnp.ndarray, model.apply({"params": params}, inputs, method="encode"))


def init_cache(
    model: nn.Module, params, encoded: jnp.ndarray, inputs: jnp.ndarray, max_decode_len: int, beam_size: int = 1
) -> Cache:
    """A fresh cache for `max_decode_len` target steps; cross-attention keys/values of `encoded` filled in.

    encoded: [sources, src_len, d_model] from Transformer.encode; inputs: [rows, src_len] source ids, one row
    per decoded sequence: rows = sources, or sources * beam_size with each source repeated for its hypotheses
    (the memory keys/values are then stored once per source and shared, and the self-attention keys of a source's
    hypotheses form one group of block beam_size, kv_cache.KVCache).
    The call runs the decoder once on a [rows, max_decode_len] dummy target only to size the cache; under
    jit its logits are unused and XLA drops that work (only the memory key/value projections remain).
    """
    rows = inputs.shape[0]
    dummy = jnp.zeros((rows, max_decode_len), jnp.int32)  # [rows, max_decode_len]
    _, variables = model.apply(
        {"params": params},
        encoded,
        inputs,
        dummy,
        decode=True,
        cache_block=beam_size,
        method="decode",
        mutable=["cache"],
    )
    return variables["cache"]


def transformer_step_fn(model: nn.Module, params, encoded: jnp.ndarray, inputs: jnp.ndarray) -> StepFn:
    """One cached decoder step: tokens [n] (the previous token of each row) -> logits [n, vocab]."""

    def step(tokens: jnp.ndarray, cache: Cache):
        logits, variables = model.apply(
            {"params": params, "cache": cache},
            encoded,
            inputs,
            tokens[:, None],
            decode=True,
            method="decode",
            mutable=["cache"],
        )
        return logits[:, 0, :].astype(jnp.float32), variables["cache"]  # [n, vocab]

    return step


def uncached_step_fn(
    model: nn.Module, params, encoded: jnp.ndarray, inputs: jnp.ndarray, max_decode_len: int, pad_id: int
) -> tuple[StepFn, Cache]:
    """The same step without a key/value cache: re-runs the decoder over the whole prefix every step.

    Its 'cache' is only the prefix buffer [n, max_decode_len] (pad beyond the written part) and the index.
    For benchmarks and as an oracle; shapes stay static, so each step costs a full max_decode_len pass.
    """
    batch = encoded.shape[0]
    state = (jnp.full((batch, max_decode_len), pad_id, jnp.int32), jnp.array(0, jnp.int32))

    def step(tokens: jnp.ndarray, state):
        prefix, index = state
        prefix = jax.lax.dynamic_update_slice(prefix, tokens[:, None].astype(jnp.int32), (0, index))
        logits = model.apply({"params": params}, encoded, inputs, prefix, method="decode")  # [n, len, vocab]
        step_logits = jax.lax.dynamic_index_in_dim(cast(jnp.ndarray, logits), index, axis=1, keepdims=False)
        return step_logits.astype(jnp.float32), (prefix, index + 1)

    return step, state


def _is_typed_cache(node) -> bool:
    return isinstance(node, (KVCache, Lineage, MemoryCache))


def reorder_cache(cache: Cache, indices: jnp.ndarray, *, one_hot: bool = False) -> Cache:
    """Hypothesis j of sentence b continues hypothesis indices[b, j] ([batch, new_beam]) in a flattened beam cache.

    Each typed cache reorders itself (kv_cache.py: a beam group moves the decoder's lineage, keys and the memory
    stay); scalars are shared by all rows and stay; any other leaf [batch * old_beam, ...] (a step function's own
    state) becomes [batch * new_beam, ...] with row (b, j) taken from (b, indices[b, j]).
    """

    def reorder(node):
        if _is_typed_cache(node):
            return node.reorder(indices, one_hot=one_hot)
        return node if jnp.ndim(node) == 0 else gather_rows(node, indices, one_hot=one_hot)

    return jax.tree.map(reorder, cache, is_leaf=_is_typed_cache)


def resize_cache(cache: Cache, max_len: int) -> Cache:
    """The cache with room for `max_len` target positions; what it holds is unchanged (kv_cache.py `resized`)."""

    def resize(node):
        if _is_typed_cache(node):
            return node.resized(max_len)
        if jnp.ndim(node) == 0:
            return node
        raise ValueError(f"a decode cache array of shape {node.shape} outside the typed caches cannot be resized.")

    return jax.tree.map(resize, cache, is_leaf=_is_typed_cache)


def logical_axes(cache: Cache) -> Cache:
    """The logical names of every cache array's dimensions, a PartitionSpec per array in the cache's structure:
    those the typed caches declare (kv_cache.py), () for shared scalars."""

    def axes(node):
        if _is_typed_cache(node):
            return node.logical_axes()
        if jnp.ndim(node) == 0:
            return PartitionSpec()
        raise ValueError(f"a decode cache array of shape {node.shape} outside the typed caches has no logical axes.")

    return jax.tree.map(axes, cache, is_leaf=_is_typed_cache)


def cache_shardings(cache: Cache, mesh: Mesh, rules: parallel.Rules = parallel.DEFAULT_RULES) -> Cache:
    """NamedShardings of a decode cache (arrays or ShapeDtypeStructs) from its logical axes and the rule table: split
    along 'batch' (data x fsdp) like the activations, and under the tensor rules along 'heads' like the Q/K/V
    projections; a dimension its mesh axes do not divide (a decode batch smaller than data x fsdp) is replicated."""
    return parallel.logical_tree_shardings(logical_axes(cache), cache, mesh, rules)


def constrain_cache(cache: Cache, mesh: Mesh | None, rules: parallel.Rules = parallel.DEFAULT_RULES) -> Cache:
    """Inside jit: pin the cache to the activations' sharding, split along the batch (a no-op without a mesh).

    Flattened beam caches ([batch * beam, ...]) keep each sentence's hypotheses on one device as long as the
    batch divides by the batch axes, so reorder_cache stays local.
    """
    if mesh is None:
        return cache
    return jax.lax.with_sharding_constraint(cache, cache_shardings(cache, mesh, rules))
