"""The decode cache of a Transformer as a pytree: reordering, growing and sharding it (steps.py makes it).

Layout (Flax 'cache' collection; types from layers/kv_cache.py):
  decoder/lineage                              Lineage       rows [groups, block, max_decode_len], index []: the
                                                             next position and which key slots each row reads
  decoder/layer_i/self_attention/keys_values   KVCache       keys/values [groups, heads, max_decode_len * block,
                                                             d_k | d_v], index []
  decoder/layer_i/cross_attention/memory       MemoryCache   keys/values [sources, heads, src_len, d_k | d_v],
                                                             once per source

Greedy search decodes one row per group (block 1); beam search puts each source's `beam` hypotheses in one group
(block beam, `init_cache(..., beam_size=)`), so that reordering them moves only the lineage, once for all layers.

Each operation maps over the cache's typed caches; any other leaf is a shared scalar or a step function's own
per-row state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from transformer_jax import sharding
from transformer_jax.layers.kv_cache import KVCache, Lineage, MemoryCache, gather_rows

Cache = Any


def _is_typed_cache(node) -> bool:
    return isinstance(node, (KVCache, Lineage, MemoryCache))


def _map_cache(cache: Cache, typed: Callable[[Any], Any], other: Callable[[Any], Any]) -> Cache:
    """`typed(node)` for each typed cache of `cache`, `other(leaf)` for every other leaf, in the cache's structure."""
    return jax.tree.map(
        lambda node: typed(node) if _is_typed_cache(node) else other(node), cache, is_leaf=_is_typed_cache
    )


def _scalars_only(what: str, value: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """For leaves outside the typed caches: `value(leaf)` of a shared scalar; an array there is an error."""

    def leaf(node):
        if jnp.ndim(node) == 0:
            return value(node)
        raise ValueError(f"a decode cache array of shape {node.shape} outside the typed caches {what}.")

    return leaf


def reorder_cache(cache: Cache, indices: jnp.ndarray, *, one_hot: bool = False) -> Cache:
    """Hypothesis j of sentence b continues hypothesis indices[b, j] ([batch, new_beam]) in a flattened beam cache.

    The decoder's lineage and self-attention keys reorder themselves (layers/kv_cache.py: in a beam group the lineage
    moves and the keys stay); the memory, once per source, stays; scalars are shared by all rows and stay; any other
    leaf [batch * old_beam, ...] (a step function's own state) becomes [batch * new_beam, ...] with row (b, j) taken
    from (b, indices[b, j]).
    """

    def typed(node):
        return node if isinstance(node, MemoryCache) else node.reorder(indices, one_hot=one_hot)

    def other(node):
        return node if jnp.ndim(node) == 0 else gather_rows(node, indices, one_hot=one_hot)

    return _map_cache(cache, typed, other)


def resize_cache(cache: Cache, max_len: int) -> Cache:
    """The cache with room for `max_len` target positions; what it holds is unchanged (layers/kv_cache.py `resized`;
    the memory's length is the source's, so it stays)."""

    def typed(node):
        return node if isinstance(node, MemoryCache) else node.resized(max_len)

    return _map_cache(cache, typed, _scalars_only("cannot be resized", lambda node: node))


def logical_axes(cache: Cache) -> Cache:
    """The logical names of every cache array's dimensions, a PartitionSpec per array in the cache's structure:
    those the typed caches declare (layers/kv_cache.py), () for shared scalars."""
    return _map_cache(
        cache, lambda node: node.logical_axes(), _scalars_only("has no logical axes", lambda node: PartitionSpec())
    )


def cache_shardings(cache: Cache, mesh: Mesh, rules: sharding.Rules = sharding.DEFAULT_RULES) -> Cache:
    """NamedShardings of a decode cache (arrays or ShapeDtypeStructs) from its logical axes and the rule table: split
    along 'batch' (data x fsdp) like the activations, and under the tensor rules along 'heads' like the Q/K/V
    projections; a dimension its mesh axes do not divide (a decode batch smaller than data x fsdp) is replicated."""
    return sharding.logical_tree_shardings(logical_axes(cache), cache, mesh, rules)


def constrain_cache(cache: Cache, mesh: Mesh | None, rules: sharding.Rules = sharding.DEFAULT_RULES) -> Cache:
    """Inside jit: pin the cache to the activations' sharding, split along the batch (a no-op without a mesh).

    Flattened beam caches ([batch * beam, ...]) keep each sentence's hypotheses on one device as long as the
    batch divides by the batch axes, so reorder_cache stays local.
    """
    if mesh is None:
        return cache
    return jax.lax.with_sharding_constraint(cache, cache_shardings(cache, mesh, rules))
