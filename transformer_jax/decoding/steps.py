"""A Transformer as the step function the searches consume: encode once, make the cache, step with it.

A step function `step_fn(tokens [n], cache) -> (logits [n, vocab] float32, cache)` is what the searches in greedy.py
and beam.py consume; they never look inside the model. `transformer_step_fn` is the cached decoder step;
`uncached_step_fn` re-runs the decoder over the whole prefix (an oracle, and a benchmark's baseline).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.decoding.cache import Cache

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
    hypotheses form one group of block beam_size, layers/kv_cache.KVCache).
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
