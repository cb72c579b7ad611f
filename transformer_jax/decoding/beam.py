"""Beam search with the GNMT length penalty and exact early termination (§6.1: beam 4, alpha 0.6).

Reading guide. Each step extends every live hypothesis by every token, keeps the 2*beam best extensions
by log-probability, and splits them: those ending in EOS (or reaching the sentence's length limit) compete
for the `beam` slots of the finished list, by length-penalised score; the others fill the `beam` live
slots. Because a live hypothesis contributes at most one EOS extension, at most `beam` of the 2*beam
candidates are finished, so the live beam never starves (tensor2tensor, flax examples/wmt, t5x).

Scores. score(Y) = log P(Y | X) / lp(|Y|), lp(n) = ((5 + n) / 6) ** alpha, with |Y| counting the EOS
(a hypothesis cut at its length limit counts its tokens). The pad token is never generated.

Termination. A live hypothesis with log-probability s can at best finish with score s / max_n lp(n) over
the lengths n it can still reach (log-probabilities only fall as tokens are added). When, for every
sentence, that bound for the best live hypothesis cannot beat the worst of `beam` finished hypotheses, no
further step can change the n-best list, and the loop stops; otherwise it runs to the length limit.

Layout. The model sees hypotheses flattened to [batch * beam, ...] (rows of a sentence are adjacent, so a
batch-sharded cache keeps them on one device); search arrays are [batch, beam, ...].
"""

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
    reorder_cache,
    transformer_step_fn,
)
from transformer_jax.decoding.config import (
    NEG_INF,
    DecodeConfig,
    cache_lengths,
    length_penalty,
    per_sentence_limits,
    resolve_max_decode_len,
)
from transformer_jax.decoding.kv_cache import gather_beams
from transformer_jax.decoding.select import top_k


class BeamState(NamedTuple):
    step: jnp.ndarray  # [] tokens generated so far by every live hypothesis
    live_seqs: jnp.ndarray  # [batch, beam, max_decode_len] pad-filled
    live_log_probs: jnp.ndarray  # [batch, beam] sorted best first; NEG_INF marks an empty slot
    finished_seqs: jnp.ndarray  # [batch, beam, max_decode_len]
    finished_scores: jnp.ndarray  # [batch, beam] length-penalised, sorted best first; NEG_INF when empty
    finished_flags: jnp.ndarray  # [batch, beam] bool: the slot holds a finished hypothesis
    cache: Cache  # leaves [batch * beam, ...]


def _is_valid(log_probs):
    """Slots descended from an empty (NEG_INF) slot are not hypotheses."""
    return log_probs > NEG_INF / 2


def search_should_continue(
    state: BeamState, *, max_decode_len: int, max_lengths: jnp.ndarray, alpha: float
) -> jnp.ndarray:
    """False once no live hypothesis of any sentence can still enter its finished n-best list."""
    index = state.step
    # The largest length penalty any live hypothesis can still reach: lp is monotone in the length, so it is
    # at one end of [index + 1, limit] (the limit for alpha >= 0).
    best_penalty = jnp.maximum(length_penalty(index + 1, alpha), length_penalty(max_lengths, alpha))  # [batch]
    best_live = state.live_log_probs[:, 0]  # [batch]: sorted, the best first
    live_bound = best_live / best_penalty
    worst_finished = jnp.where(jnp.all(state.finished_flags, axis=1), state.finished_scores[:, -1], NEG_INF)
    sentence_done = (worst_finished >= live_bound) | ~_is_valid(best_live) | (index >= max_lengths)
    return (index < max_decode_len) & ~jnp.all(sentence_done)


def beam_search_core(
    step_fn: StepFn,
    cache: Cache,
    *,
    batch_size: int,
    beam_size: int,
    alpha: float,
    max_decode_len: int,
    max_lengths: jnp.ndarray | None = None,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    one_hot: bool = False,
    early_stopping: bool = True,
    constrain: Callable[[Cache], Cache] = lambda cache: cache,
    cache_lengths: Sequence[int] | None = None,
    return_state: bool = False,
):
    """Beam search over any step function (traceable; call it inside jit).

    cache: leaves [batch * beam_size, ...] (rows of a sentence adjacent). max_lengths: [batch] per-sentence
    length limits (default max_decode_len). cache_lengths: the lengths a decode cache grows through
    (cache.growing_cache_loop; `cache` starts at the first), default (max_decode_len,). early_stopping=False runs
    every sentence to its limit (same result, for tests). return_state=True also returns the final BeamState (e.g.
    `.step`, the steps run).
    Returns (sequences [batch, beam, max_decode_len] pad after EOS, scores [batch, beam])
    best first; slots with no hypothesis (tiny vocabularies only) have score -inf and pad tokens.
    """
    batch, beam, length = batch_size, beam_size, max_decode_len
    if max_lengths is None:
        max_lengths = jnp.full((batch,), length, jnp.int32)
    positions = jnp.arange(length)

    def gather(x, indices):
        return gather_beams(x, indices, one_hot=one_hot)

    def continue_search(state: BeamState):
        if not early_stopping:
            return (state.step < length) & (state.step < jnp.max(max_lengths))
        return search_should_continue(state, max_decode_len=length, max_lengths=max_lengths, alpha=alpha)

    def step(state: BeamState) -> BeamState:
        index = state.step
        # 1. Next-token logits of every live hypothesis.
        previous = jnp.take_along_axis(state.live_seqs, jnp.maximum(index - 1, 0)[None, None, None], axis=2)
        previous = jnp.where(index == 0, bos_id, previous[..., 0])  # [batch, beam]
        logits, cache = step_fn(previous.reshape(batch * beam), state.cache)  # [batch * beam, vocab]
        # 2. The 2*beam best extensions of all hypotheses: [batch, 2 * beam]. They lie among the 2*beam best
        # tokens of each hypothesis (plus pad, which is dropped), so one top-k over each row's logits (whose
        # order is the log-softmax's) cuts the search to [batch, beam * (2 * beam + 1)] candidates; no
        # [batch * beam, vocab] array of log-probabilities is written.
        per_row = min(2 * beam + 1, logits.shape[-1])  # a vocabulary smaller than that keeps every token
        row_logits, row_tokens = top_k(logits, per_row)  # [batch * beam, per_row]
        row_log_probs = row_logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
        row_log_probs = jnp.where(row_tokens == pad_id, NEG_INF, row_log_probs)
        row_log_probs = row_log_probs.reshape(batch, beam, -1) + state.live_log_probs[:, :, None]
        candidates = row_log_probs.shape[-1]
        top_log_probs, top_flat = lax.top_k(row_log_probs.reshape(batch, beam * candidates), 2 * beam)
        top_parents = top_flat // candidates
        top_tokens = jnp.take_along_axis(row_tokens.reshape(batch, beam * candidates), top_flat, axis=1)
        top_seqs = gather(state.live_seqs, top_parents)  # [batch, 2 * beam, length]
        top_seqs = jnp.where(positions == index, top_tokens[:, :, None], top_seqs)
        new_length = index + 1  # |Y|, EOS included
        ends = (top_tokens == eos_id) | (new_length >= max_lengths)[:, None]  # [batch, 2 * beam]
        ends = ends & _is_valid(top_log_probs)

        # 3. Live: the best `beam` extensions that did not end. The cache follows its parents (reorder_cache).
        live_log_probs, live_pick = lax.top_k(jnp.where(ends, NEG_INF, top_log_probs), beam)  # [batch, beam]
        live_seqs = gather(top_seqs, live_pick)
        cache = reorder_cache(cache, jnp.take_along_axis(top_parents, live_pick, axis=1), one_hot=one_hot)

        # 4. Finished: merge the ended extensions into the finished list by length-penalised score.
        scores = jnp.where(ends, top_log_probs / length_penalty(new_length, alpha), NEG_INF)
        pool_scores = jnp.concatenate([state.finished_scores, scores], axis=1)  # [batch, 3 * beam], old first
        pool_seqs = jnp.concatenate([state.finished_seqs, top_seqs], axis=1)
        pool_flags = jnp.concatenate([state.finished_flags, ends], axis=1)
        finished_scores, finished_pick = lax.top_k(pool_scores, beam)
        return BeamState(
            step=new_length,
            live_seqs=live_seqs,
            live_log_probs=live_log_probs,
            finished_seqs=gather(pool_seqs, finished_pick),
            finished_scores=finished_scores,
            finished_flags=jnp.take_along_axis(pool_flags, finished_pick, axis=1),
            cache=constrain(cache),
        )

    # All beams of a sentence start identical; only slot 0 is live so they do not produce duplicates.
    initial = BeamState(
        step=jnp.array(0, jnp.int32),
        live_seqs=jnp.full((batch, beam, length), pad_id, jnp.int32),
        live_log_probs=jnp.tile(jnp.array([0.0] + [NEG_INF] * (beam - 1), jnp.float32), (batch, 1)),
        finished_seqs=jnp.full((batch, beam, length), pad_id, jnp.int32),
        finished_scores=jnp.full((batch, beam), NEG_INF, jnp.float32),
        finished_flags=jnp.zeros((batch, beam), bool),
        cache=constrain(cache),
    )
    final = growing_cache_loop(continue_search, step, initial, cache_lengths or (length,))
    # Every sentence ends at its limit with all live hypotheses finished, or stops early with a full list.
    sequences = jnp.where(final.finished_flags[:, :, None], final.finished_seqs, pad_id)
    scores = jnp.where(final.finished_flags, final.finished_scores, -jnp.inf)
    return (sequences, scores, final) if return_state else (sequences, scores)


def _repeat_for_beams(x: jnp.ndarray, beam_size: int) -> jnp.ndarray:
    """[batch, ...] -> [batch * beam, ...], each row repeated beam_size times (adjacent)."""
    return jnp.repeat(x, beam_size, axis=0)


@functools.partial(
    jax.jit,
    static_argnames=(
        "model",
        "beam_size",
        "alpha",
        "max_decode_len",
        "extra_length",
        "cache_segment",
        "one_hot",
        "early_stopping",
        "mesh",
        "rules",
    ),
)
def _beam_search(
    model: nn.Module,
    params,
    inputs,
    *,
    beam_size: int,
    alpha: float,
    max_decode_len: int,
    extra_length: int,
    cache_segment: int,
    one_hot: bool,
    early_stopping: bool,
    mesh: Mesh | None,
    rules,
):
    cfg = model.config
    encoded = encode(model, params, inputs)  # [batch, src_len, d_model]
    # The encoder runs once per sentence, and its cross-attention keys/values are stored once per sentence and
    # shared by its hypotheses (layers.attention groups the query rows); only the source ids are repeated. The
    # hypotheses' self-attention keys stay where they were computed, in one group per sentence (kv_cache.KVCache).
    flat_inputs = _repeat_for_beams(inputs, beam_size)  # [batch * beam, src_len]
    lengths = cache_lengths(max_decode_len, cache_segment)
    cache = init_cache(model, params, encoded, flat_inputs, lengths[0], beam_size=beam_size)
    return beam_search_core(
        transformer_step_fn(model, params, encoded, flat_inputs),
        cache,
        batch_size=inputs.shape[0],
        beam_size=beam_size,
        alpha=alpha,
        max_decode_len=max_decode_len,
        max_lengths=per_sentence_limits(inputs, cfg.pad_id, extra_length, max_decode_len),
        bos_id=cfg.bos_id,
        eos_id=cfg.eos_id,
        pad_id=cfg.pad_id,
        one_hot=one_hot,
        early_stopping=early_stopping,
        constrain=lambda cache: constrain_cache(cache, mesh, rules),
        cache_lengths=lengths,
    )


def beam_search(
    model: nn.Module,
    params,
    inputs: ArrayLike,
    *,
    beam_size: int | None = None,
    alpha: float | None = None,
    max_decode_len: int | None = None,
    config: DecodeConfig | None = None,
    mesh: Mesh | None = None,
    rules: parallel.Rules = parallel.DEFAULT_RULES,
    early_stopping: bool = True,
):
    """Beam search translation of `inputs` [batch, src_len] (pad_id = padding) with a Transformer.

    beam_size and alpha default to `config` (DecodeConfig: §6.1's beam 4, alpha 0.6). Each sentence's output
    is limited to its source length + config.extra_length, within the static buffer `max_decode_len` (default
    padded source width + extra_length, clipped to the model's max_len).
    Returns (sequences [batch, beam, max_decode_len], pad after EOS; scores [batch, beam] =
    log P(Y | X) / lp(|Y|), |Y| counting EOS), best first.
    """
    config = DecodeConfig() if config is None else config
    beam_size = config.beam_size if beam_size is None else beam_size
    alpha = config.alpha if alpha is None else alpha
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, got {beam_size!r}.")
    inputs = jnp.asarray(inputs, jnp.int32)
    if inputs.ndim != 2:
        raise ValueError(f"inputs must be [batch, src_len] token ids, got shape {inputs.shape}.")
    max_decode_len = resolve_max_decode_len(inputs.shape[1], config, max_decode_len, model.config.max_len)
    return _beam_search(
        model,
        as_params(params),
        inputs,
        beam_size=beam_size,
        alpha=float(alpha),
        max_decode_len=max_decode_len,
        extra_length=config.extra_length,
        cache_segment=config.cache_segment,
        one_hot=config.gather == "one_hot",
        early_stopping=early_stopping,
        mesh=mesh,
        rules=tuple(rules),
    )
