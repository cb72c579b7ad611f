"""Greedy decoding: one argmax token per step over the cached decoder, in a jitted lax.while_loop.

`GreedySearch` is the search itself (its state, one step, which sentences are done, the outputs); greedy_search
runs it inside one jit over any step function, greedy_decode runs it on a Transformer through driver.py (a cache
that grows, finished sentences leaving the batch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

import flax.linen as nn
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.typing import ArrayLike

from transformer_jax import sharding
from transformer_jax.decoding.cache import Cache
from transformer_jax.decoding.config import NEG_INF, DecodeConfig
from transformer_jax.decoding.driver import decode_in_segments, run_search
from transformer_jax.decoding.select import first_argmax, log_normaliser
from transformer_jax.decoding.sentences import Sentences
from transformer_jax.decoding.steps import StepFn


class GreedyState(NamedTuple):
    step: jnp.ndarray  # [] tokens generated so far
    tokens: jnp.ndarray  # [batch, max_decode_len] output, pad-filled
    last: jnp.ndarray  # [batch] token fed at the next step
    done: jnp.ndarray  # [batch] bool: emitted EOS or reached its length limit
    log_probs: jnp.ndarray  # [batch] sum of log p(token) of the emitted tokens
    cache: Cache


@dataclasses.dataclass(frozen=True)
class GreedySearch:
    """Greedy search with these token ids (hashable: a static argument of jit). One decoded row per sentence."""

    bos_id: int
    eos_id: int
    pad_id: int
    rows_per_sentence = 1

    def initial(self, cache: Cache, batch_size: int, max_decode_len: int) -> GreedyState:
        return GreedyState(
            step=jnp.array(0, jnp.int32),
            tokens=jnp.full((batch_size, max_decode_len), self.pad_id, jnp.int32),
            last=jnp.full((batch_size,), self.bos_id, jnp.int32),
            done=jnp.zeros((batch_size,), bool),
            log_probs=jnp.zeros((batch_size,), jnp.float32),
            cache=cache,
        )

    def step(self, step_fn: StepFn, state: GreedyState, sentences: Sentences) -> GreedyState:
        logits, cache = step_fn(state.last, state.cache)  # [batch, vocab] float32
        # The argmax of the logits is the log-softmax's; pad is not a token a translation may contain.
        best_logit, best = first_argmax(logits.at[:, self.pad_id].set(NEG_INF))  # [batch], [batch]
        row_max = jnp.maximum(best_logit, logits[:, self.pad_id])  # the maximum with pad back in
        forcing, forced = sentences.forced(state.step)
        token = jnp.where(forcing, forced, best)
        token_logit = jnp.where(forcing, jnp.take_along_axis(logits, forced[:, None], axis=1)[:, 0], best_logit)
        token_log_prob = token_logit - log_normaliser(logits, row_max)
        token = jnp.where(state.done, self.pad_id, token)
        return GreedyState(
            step=state.step + 1,
            tokens=lax.dynamic_update_slice(state.tokens, token[:, None], (0, state.step)),
            last=token,
            done=state.done | (token == self.eos_id) | (state.step + 1 >= sentences.limits),
            log_probs=state.log_probs + jnp.where(state.done, 0.0, token_log_prob),
            cache=cache,
        )

    def sentences_done(self, state: GreedyState, sentences: Sentences) -> jnp.ndarray:
        """[batch] bool: the sentence's output can no longer change."""
        return state.done

    def outputs(self, state: GreedyState) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
        """(tokens [batch, max_decode_len] pad after EOS, lengths [batch] counting the EOS, log P(tokens) [batch])."""
        return state.tokens, jnp.sum(state.tokens != self.pad_id, axis=-1).astype(jnp.int32), state.log_probs


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
    (driver.growing_cache_loop; `cache` starts at the first), default (max_decode_len,), one fixed cache.
    Returns (tokens [batch, max_decode_len] with pad after EOS, lengths [batch] counting the EOS, log_probs
    [batch] = log P(tokens)).
    """
    search = GreedySearch(bos_id, eos_id, pad_id)
    final = run_search(search, step_fn, cache, batch_size, max_decode_len, max_lengths, constrain, cache_lengths)
    return search.outputs(final)


def greedy_decode(
    model: nn.Module,
    params,
    inputs: ArrayLike,
    *,
    max_decode_len: int | None = None,
    config: DecodeConfig | None = None,
    mesh: Mesh | None = None,
    rules: sharding.Rules = sharding.DEFAULT_RULES,
    return_log_probs: bool = False,
    prefixes: Sequence[Sequence[int]] | None = None,
):
    """Greedy translation of `inputs` [batch, src_len] (pad_id = padding) with a Transformer.

    Each sentence stops at EOS or at its own limit, source length + config.extra_length (§6.1), within the
    static buffer `max_decode_len` (default: padded source width + extra_length, clipped to the model's
    max_len). prefixes: per sentence, target tokens its output starts with (forced; their log-probabilities
    counted). Returns (tokens [batch, max_decode_len], pad after EOS; lengths [batch], EOS counted) and, with
    return_log_probs, log P(tokens) [batch] as a third element (numpy arrays).
    """
    cfg = model.config
    search = GreedySearch(cfg.bos_id, cfg.eos_id, cfg.pad_id)
    tokens, lengths, log_probs = decode_in_segments(
        model,
        params,
        inputs,
        search,
        max_decode_len=max_decode_len,
        config=config,
        mesh=mesh,
        rules=rules,
        prefixes=prefixes,
    )
    return (tokens, lengths, log_probs) if return_log_probs else (tokens, lengths)
