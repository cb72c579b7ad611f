"""The decode cache of a Transformer as a pytree: creating it, stepping with it, reordering and sharding it.

Layout (Flax 'cache' collection, one subtree per decoder layer `decoder/layer_i`):
  self_attention/cached_key, cached_value   [batch, heads, max_decode_len, head_dim]  one position per step
                          with_lineage:     [sources, heads, max_decode_len * beam, head_dim]
  self_attention/cache_index                []                                        next write position
  self_attention/lineage                    [sources, beam, max_decode_len] int32     with_lineage only
  cross_attention/memory_key, memory_value  [sources, heads, src_len, head_dim]       computed once per source
  decoder/position                          []                                        next target position

Keys/values are heads-major, so a decode step reads them with batched dots as stored (layers/attention.py).

A step function `step_fn(tokens [n], cache) -> (logits [n, vocab] float32, cache)` is what the searches
in greedy.py and beam.py consume; they never look inside the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from transformer_jax import parallel

Cache = Any
StepFn = Callable[[jnp.ndarray, Cache], tuple[jnp.ndarray, Cache]]

# Cache leaves that are the same for every hypothesis of one source sentence: never reordered across beams.
SOURCE_LEAVES = ("memory_key", "memory_value")
# Self-attention keys/values; with a lineage leaf beside them they stay in the row that computed them.
SELF_LEAVES = ("cached_key", "cached_value")
LINEAGE = "lineage"


def as_params(params):
    """Accepts `params`, `{'params': params}`, boxed (nn.with_logical_partitioning) or plain; returns plain."""
    params = nn.unbox(params)
    if (isinstance(params, dict) or hasattr(params, "keys")) and set(params.keys()) == {"params"}:
        params = params["params"]
    return params


def encode(model: nn.Module, params, inputs: jnp.ndarray) -> jnp.ndarray:
    """The encoder output [batch, src_len, d_model] of `inputs` [batch, src_len], once per source sentence."""
    return cast(jnp.ndarray, model.apply({"params": params}, inputs, method="encode"))


def init_cache(model: nn.Module, params, encoded: jnp.ndarray, inputs: jnp.ndarray, max_decode_len: int) -> Cache:
    """A fresh cache for `max_decode_len` target steps; cross-attention keys/values of `encoded` filled in.

    encoded: [sources, src_len, d_model] from Transformer.encode; inputs: [rows, src_len] source ids, one row
    per decoded sequence: rows = sources, or sources * beam with each source repeated for its hypotheses (the
    memory keys/values are then stored once per source and shared, see layers.attention).
    The call runs the decoder once on a [rows, max_decode_len] dummy target only to size the cache; under
    jit its logits are unused and XLA drops that work (only the memory key/value projections remain).
    """
    rows = inputs.shape[0]
    dummy = jnp.zeros((rows, max_decode_len), jnp.int32)  # [rows, max_decode_len]
    _, variables = model.apply(
        {"params": params}, encoded, inputs, dummy, decode=True, method="decode", mutable=["cache"]
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
        step_logits = jax.lax.dynamic_index_in_dim(logits, index, axis=1, keepdims=False)  # [n, vocab]
        return step_logits.astype(jnp.float32), (prefix, index + 1)

    return step, state


def _leaf_name(path) -> str:
    last = path[-1] if path else None
    return str(getattr(last, "key", getattr(last, "name", last)))


def gather_beams(x: jnp.ndarray, indices: jnp.ndarray, *, one_hot: bool = False) -> jnp.ndarray:
    """x: [batch, old_beam, ...], indices: [batch, new_beam] -> [batch, new_beam, ...] = x[b, indices[b, j]].

    Both forms gather within each batch row only, so a batch-sharded array needs no communication.
    'one_hot' multiplies by a [batch, new_beam, old_beam] selection matrix (matmul units, exact at HIGHEST).
    """
    if one_hot:
        selection = jax.nn.one_hot(indices, x.shape[1], dtype=jnp.float32)  # [batch, new_beam, old_beam]
        if jnp.issubdtype(x.dtype, jnp.floating):
            return jnp.einsum("bno,bo...->bn...", selection.astype(x.dtype), x, precision=jax.lax.Precision.HIGHEST)
        return jnp.einsum("bno,bo...->bn...", selection.astype(jnp.int32), x.astype(jnp.int32)).astype(x.dtype)
    expanded = indices.reshape(indices.shape + (1,) * (x.ndim - 2))  # [batch, new_beam, 1, ...]
    return jnp.take_along_axis(x, expanded, axis=1)


def with_lineage(cache: Cache, beam_size: int) -> Cache:
    """A fresh beam cache whose self-attention keys/values are never moved: each self-attention layer gets one
    block [sources, heads, max_decode_len * beam, head_dim] per source (position t of block row k at t * beam + k)
    and a `lineage` [sources, beam, max_decode_len] (which row of its source's block holds each position of the
    hypothesis in row j), and reorder_cache moves that small table instead of the keys and values.

    Per step, reordering the keys/values costs a copy of the whole cache (the [100 * 4, 66, 128] float32 keys and
    values of 4 layers: 108 MB), the lineage a beam-times wider attention read; layers.attention does the rest.
    """

    def add(subtree):
        if not isinstance(subtree, dict) and not hasattr(subtree, "keys"):
            return subtree
        subtree = {name: add(child) for name, child in subtree.items()}
        if "cached_key" in subtree:
            rows, heads, max_decode_len, head_dim = subtree["cached_key"].shape
            sources = rows // beam_size
            for name in SELF_LEAVES:  # still empty: a fresh block [sources, heads, max_decode_len * beam, head_dim]
                block = (sources, heads, max_decode_len * beam_size, head_dim)
                subtree[name] = jnp.zeros(block, subtree[name].dtype)
            subtree[LINEAGE] = jnp.zeros((sources, beam_size, max_decode_len), jnp.int32)
        return subtree

    return add(cache)


def reorder_cache(cache: Cache, indices: jnp.ndarray, *, one_hot: bool = False) -> Cache:
    """Reorders the per-hypothesis rows of a flattened beam cache: leaves [batch * old_beam, ...] ->
    [batch * new_beam, ...] with row (b, j) taken from (b, indices[b, j]).

    Scalars (cache_index, position) are shared by all rows and stay; cross-attention memory_key/value hold one
    row per source, shared by its hypotheses, so they are not moved; in a cache made `with_lineage` the
    self-attention keys/values stay too and their lineage [batch, beam, ...] moves instead.
    """
    batch, new_beam = indices.shape
    leaves = jax.tree_util.tree_flatten_with_path(cache)[0]
    has_lineage = {path[:-1] for path, _ in leaves if _leaf_name(path) == LINEAGE}

    def reorder(path, leaf):
        name = _leaf_name(path)
        if leaf.ndim == 0 or name in SOURCE_LEAVES or (name in SELF_LEAVES and path[:-1] in has_lineage):
            return leaf
        if name == LINEAGE:
            return gather_beams(leaf, indices, one_hot=one_hot)
        old_beam = leaf.shape[0] // batch
        per_beam = leaf.reshape((batch, old_beam) + leaf.shape[1:])  # [batch, old_beam, ...]
        gathered = gather_beams(per_beam, indices, one_hot=one_hot)  # [batch, new_beam, ...]
        return gathered.reshape((batch * new_beam,) + leaf.shape[1:])

    return jax.tree_util.tree_map_with_path(reorder, cache)


def constrain_cache(cache: Cache, mesh: Mesh | None, rules: parallel.Rules = parallel.DEFAULT_RULES) -> Cache:
    """Inside jit: pin the cache to the activations' sharding, split along the batch (a no-op without a mesh).

    Flattened beam caches ([batch * beam, ...]) keep each sentence's hypotheses on one device as long as the
    batch divides by the batch axes, so reorder_cache stays local.
    """
    if mesh is None:
        return cache
    return jax.lax.with_sharding_constraint(cache, parallel.decode_cache_shardings(cache, mesh, rules))
