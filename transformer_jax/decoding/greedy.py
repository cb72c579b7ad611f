"""Greedy decoding: a jitted lax.while_loop over the cached decoder, one argmax token per step."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.typing import ArrayLike

from transformer_jax import parallel
from transformer_jax.decoding.cache import (
    Cache,
    StepFn,
    as_params,
    constrain_cache,
    encode,
    growing_cache_loop,
    init_cache,
    transformer_step_fn,
)
from transformer_jax.decoding.config import (
    NEG_INF,
    DecodeConfig,
    cache_lengths,
    per_sentence_limits,
    resolve_max_decode_len,
)
from transformer_jax.decoding.select import first_argmax


class GreedyState(NamedTuple):
    step: jnp.ndarray  # [] tokens generated so far
    tokens: jnp.ndarray  # [batch, max_decode_len] output, pad-filled
    last: jnp.ndarray  # [batch] token fed at the next step
    done: jnp.ndarray  # [batch] bool: emitted EOS or reached its length limit
    log_probs: jnp.ndarray  # [batch] sum of log p(token) of the emitted tokens
    cache: Cache


def greedy_search(
    step_fn: StepFn,
    cache: Cache,
    *,
    batch_size: int,
    max_decode_len: int,
    max_lengths: jnp.ndarray | None = None,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    constrain: Callable[[Cache], Cache] = lambda cache: cache,
    cache_lengths: Sequence[int] | None = None,
):
    """Greedy search over any step function (traceable; call it inside jit).

    Stops when every row has emitted EOS or reached its limit (`max_lengths` [batch], default
    max_decode_len). The pad token is never chosen. cache_lengths: the lengths a decode cache grows through
    (cache.growing_cache_loop; `cache` starts at the first), default (max_decode_len,), one fixed cache.
    Returns (tokens [batch, max_decode_len] with pad after EOS, lengths [batch] counting the EOS, log_probs
    [batch] = log P(tokens)).
    """
    if max_lengths is None:
        max_lengths = jnp.full((batch_size,), max_decode_len, jnp.int32)

    def not_finished(state: GreedyState):
        return (state.step < max_decode_len) & ~jnp.all(state.done)

    def step(state: GreedyState) -> GreedyState:
        logits, cache = step_fn(state.last, state.cache)  # [batch, vocab] float32
        # The argmax of the logits is the log-softmax's; pad is not a token a translation may contain.
        token_logit, token = first_argmax(logits.at[:, pad_id].set(NEG_INF))  # [batch], [batch]
        token_log_prob = token_logit - jax.nn.logsumexp(logits, axis=-1)
        token = jnp.where(state.done, pad_id, token)
        tokens = lax.dynamic_update_slice(state.tokens, token[:, None], (0, state.step))
        done = state.done | (token == eos_id) | (state.step + 1 >= max_lengths)
        return GreedyState(
            step=state.step + 1,
            tokens=tokens,
            last=token,
            done=done,
            log_probs=state.log_probs + jnp.where(state.done, 0.0, token_log_prob),
            cache=constrain(cache),
        )

    initial = GreedyState(
        step=jnp.array(0, jnp.int32),
        tokens=jnp.full((batch_size, max_decode_len), pad_id, jnp.int32),
        last=jnp.full((batch_size,), bos_id, jnp.int32),
        done=jnp.zeros((batch_size,), bool),
        log_probs=jnp.zeros((batch_size,), jnp.float32),
        cache=constrain(cache),
    )
    final = growing_cache_loop(not_finished, step, initial, cache_lengths or (max_decode_len,))
    lengths = jnp.sum(final.tokens != pad_id, axis=-1).astype(jnp.int32)
    return final.tokens, lengths, final.log_probs


@functools.partial(
    jax.jit, static_argnames=("model", "max_decode_len", "extra_length", "cache_segment", "mesh", "rules")
)
def _greedy_decode(
    model: nn.Module,
    params,
    inputs,
    *,
    max_decode_len: int,
    extra_length: int,
    cache_segment: int,
    mesh: Mesh | None,
    rules,
):
    cfg = model.config
    encoded = encode(model, params, inputs)  # [batch, src_len, d_model]
    lengths = cache_lengths(max_decode_len, cache_segment)
    cache = init_cache(model, params, encoded, inputs, lengths[0])
    return greedy_search(
        transformer_step_fn(model, params, encoded, inputs),
        cache,
        batch_size=inputs.shape[0],
        max_decode_len=max_decode_len,
        max_lengths=per_sentence_limits(inputs, cfg.pad_id, extra_length, max_decode_len),
        bos_id=cfg.bos_id,
        eos_id=cfg.eos_id,
        pad_id=cfg.pad_id,
        constrain=lambda cache: constrain_cache(cache, mesh, rules),
        cache_lengths=lengths,
    )


def greedy_decode(
    model: nn.Module,
    params,
    inputs: ArrayLike,
    *,
    max_decode_len: int | None = None,
    config: DecodeConfig | None = None,
    mesh: Mesh | None = None,
    rules: parallel.Rules = parallel.DEFAULT_RULES,
    return_log_probs: bool = False,
):
    """Greedy translation of `inputs` [batch, src_len] (pad_id = padding) with a Transformer.

    Each sentence stops at EOS or at its own limit, source length + config.extra_length (§6.1), within the
    static buffer `max_decode_len` (default: padded source width + extra_length, clipped to the model's
    max_len). Returns (tokens [batch, max_decode_len], pad after EOS; lengths [batch], EOS counted) and,
    with return_log_probs, log P(tokens) [batch] as a third element.
    """
    config = DecodeConfig() if config is None else config
    inputs = jnp.asarray(inputs, jnp.int32)
    if inputs.ndim != 2:
        raise ValueError(f"inputs must be [batch, src_len] token ids, got shape {inputs.shape}.")
    max_decode_len = resolve_max_decode_len(inputs.shape[1], config, max_decode_len, model.config.max_len)
    tokens, lengths, log_probs = _greedy_decode(
        model,
        as_params(params),
        inputs,
        max_decode_len=max_decode_len,
        extra_length=config.extra_length,
        cache_segment=config.cache_segment,
        mesh=mesh,
        rules=tuple(rules),
    )
    return (tokens, lengths, log_probs) if return_log_probs else (tokens, lengths)
