"""The typed decode caches: their layouts, their logical axes, and how hypotheses reorder them.

`layers/attention.py` keeps a KVCache (self-attention) or a MemoryCache (cross-attention) in the Flax 'cache'
collection and reads and writes keys/values only through them; the decoder keeps one Lineage, which says which key
slots each row reads. Keys/values are heads-major, keys [groups, heads, length, d_k] and values
[groups, heads, length, d_v] (§3.2.2), so a decode step reads them with batched dots as stored; each group is
`block` consecutive decoded rows that read it together (block 1: one row per sequence; block beam: the hypotheses
of one source in beam search, decoding/beam.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax
from jax.sharding import PartitionSpec

# Logical names of the dimensions of keys/values [groups, heads, length, d_k | d_v]; sharding.py's rule tables map
# them to mesh axes, as they do the parameters' names ('kv' names d_k and d_v, as in the projections' kernels).
KV_AXES = PartitionSpec("batch", "heads", "length", "kv")


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


def gather_rows(x: jnp.ndarray, indices: jnp.ndarray, *, one_hot: bool = False) -> jnp.ndarray:
    """gather_beams on flattened rows: x [batch * old_beam, ...] -> [batch * new_beam, ...], row (b, j) from
    row (b, indices[b, j])."""
    batch, new_beam = indices.shape
    per_beam = x.reshape((batch, -1) + x.shape[1:])  # [batch, old_beam, ...]
    return gather_beams(per_beam, indices, one_hot=one_hot).reshape((batch * new_beam,) + x.shape[1:])


class Lineage(struct.PyTreeNode):
    """Which row of its group holds each decoded position of each hypothesis: one table for the whole decoder,
    since every self-attention layer's cache is laid out and reordered alike (decoding/cache.py: decoder/lineage).

    rows: [groups, block, max_len] int32: for the hypothesis now in row j of a group, the row of the group that
    holds its position s (KVCache keeps the key of position t written by row k at t * block + k). Reordering
    hypotheses moves this table, not the keys. index: [] int32, the position the next step decodes.
    """

    rows: jax.Array
    index: jax.Array
    block: int = struct.field(pytree_node=False)

    @classmethod
    def empty(cls, rows: int, max_len: int, block: int = 1) -> Lineage:
        if rows % block:
            raise ValueError(f"{rows} decoded rows do not split into groups of block={block}.")
        return cls(
            rows=jnp.zeros((rows // block, block, max_len), jnp.int32),  # [groups, block, max_len]
            index=jnp.array(0, jnp.int32),
            block=block,
        )

    def advance(self) -> tuple[Lineage, jnp.ndarray]:
        """The step at `index`: each row holds its own new position. Returns the advanced table and the mask
        [rows, 1, 1, max_len * block] over a KVCache's key slots: each row sees the positions up to and including
        `index` of its own hypothesis (§3.2.3), in whichever row of the group wrote them."""
        groups, block, max_len = self.rows.shape
        own_rows = jnp.broadcast_to(jnp.arange(block, dtype=jnp.int32)[None, :, None], (groups, block, 1))
        rows = lax.dynamic_update_slice(self.rows, own_rows, (0, 0, self.index))
        filled = jnp.arange(max_len) <= self.index  # [max_len]
        holds = rows[:, :, :, None] == jnp.arange(block)  # [groups, block (row j), max_len, block (row k)]
        visible = (holds & filled[:, None]).reshape(groups * block, 1, 1, max_len * block)
        return self.replace(rows=rows, index=self.index + 1), visible

    def resized(self, max_len: int) -> Lineage:
        """Room for `max_len` positions (at least those it has)."""
        extra = max_len - self.rows.shape[-1]
        if extra < 0:
            raise ValueError(f"a cache of {self.rows.shape[-1]} positions cannot shrink to {max_len}.")
        return self.replace(rows=jnp.pad(self.rows, ((0, 0), (0, 0), (0, extra))))

    def reorder(self, indices: jnp.ndarray, *, one_hot: bool = False) -> Lineage:
        """Hypothesis j of sentence b continues hypothesis indices[b, j] ([batch, beam])."""
        if self.block == 1:
            return self.replace(rows=gather_rows(self.rows, indices, one_hot=one_hot))
        if indices.shape != self.rows.shape[:2]:
            raise ValueError(
                f"reorder indices {indices.shape} do not match the groups of the cache: {self.rows.shape[:2]}."
            )
        return self.replace(rows=gather_beams(self.rows, indices, one_hot=one_hot))

    def logical_axes(self) -> Lineage:
        return self.replace(rows=PartitionSpec("batch", None, "length"), index=PartitionSpec())


class KVCache(struct.PyTreeNode):
    """Self-attention keys/values of every position decoded so far, one position per step (§3.2.3: a position
    attends to the positions up to and including itself).

    key: [groups, heads, max_len * block, d_k], value: [groups, heads, max_len * block, d_v]; the key and value of
    position t written by row k of a group sit at t * block + k, so a step writes one contiguous slice. Which
    slots a row reads is the decoder's Lineage (block > 1: the beam's hypotheses share the group's keys).
    index: [] int32, the next position.
    """

    key: jax.Array
    value: jax.Array
    index: jax.Array
    block: int = struct.field(pytree_node=False)

    @classmethod
    def empty(cls, rows: int, heads: int, max_len: int, key_dim: int, value_dim: int, dtype, block: int = 1) -> KVCache:
        """Room for `max_len` positions of `rows` decoded rows, in groups of `block` consecutive rows; keys of
        key_dim (d_k) and values of value_dim (d_v) per head."""
        if rows % block:
            raise ValueError(f"{rows} decoded rows do not split into groups of block={block}.")
        groups = rows // block
        return cls(
            key=jnp.zeros((groups, heads, max_len * block, key_dim), dtype),  # [groups, heads, max_len * block, d_k]
            value=jnp.zeros((groups, heads, max_len * block, value_dim), dtype),  # [.., d_v]
            index=jnp.array(0, jnp.int32),
            block=block,
        )

    def append(self, key: jnp.ndarray, value: jnp.ndarray, mask: jnp.ndarray | None = None):
        """Writes this step's key [rows, heads, 1, d_k] and value [rows, heads, 1, d_v] at `index`.

        Returns the new cache and the mask over its key slots: `mask` ([rows, 1 | heads, 1, max_len * block], the
        decoder's Lineage.advance) or, without one, every slot written so far ([1, 1, 1, max_len * block]).
        """
        groups, heads, slots = self.key.shape[:3]
        block = self.block

        def write(cache, new):  # new: [rows, heads, 1, d] -> positions index * block ... + block - 1
            new = jnp.swapaxes(new[:, :, 0].reshape(groups, block, heads, -1), 1, 2)  # [groups, heads, block, d]
            return lax.dynamic_update_slice(cache, new.astype(cache.dtype), (0, 0, self.index * block, 0))

        if mask is None:
            mask = (jnp.arange(slots) < (self.index + 1) * block)[None, None, None, :]
        cache = self.replace(key=write(self.key, key), value=write(self.value, value), index=self.index + 1)
        return cache, mask

    def resized(self, max_len: int) -> KVCache:
        """The same cache with room for `max_len` positions (at least those it has): zeros appended, as `empty`."""
        extra = max_len - self.key.shape[2] // self.block
        if extra < 0:
            raise ValueError(f"a cache of {self.key.shape[2] // self.block} positions cannot shrink to {max_len}.")
        more_positions = ((0, 0), (0, 0), (0, extra * self.block), (0, 0))
        return self.replace(key=jnp.pad(self.key, more_positions), value=jnp.pad(self.value, more_positions))

    def reorder(self, indices: jnp.ndarray, *, one_hot: bool = False) -> KVCache:
        """Hypothesis j of sentence b continues hypothesis indices[b, j] ([batch, beam]).

        In groups of the beam the keys stay (the decoder's Lineage moves); with block 1 each row owns its keys,
        and they are copied to the rows of their continuations.
        """
        if self.block == 1:
            key, value = (gather_rows(x, indices, one_hot=one_hot) for x in (self.key, self.value))
            return self.replace(key=key, value=value)
        return self

    def logical_axes(self) -> KVCache:
        """The logical names of each array's dimensions (PartitionSpecs), in the cache's own structure."""
        return self.replace(key=KV_AXES, value=KV_AXES, index=PartitionSpec())


class MemoryCache(struct.PyTreeNode):
    """Cross-attention keys [sources, heads, src_len, d_k] and values [.., d_v] of the encoder output, projected once
    per source and read by all its decoded rows (its hypotheses in beam search): reordering leaves them."""

    key: jax.Array
    value: jax.Array

    def logical_axes(self) -> MemoryCache:
        return self.replace(key=KV_AXES, value=KV_AXES)
