"""Beam search with the GNMT length penalty and exact early termination (§6.1: beam 4, alpha 0.6).

Reading guide. Each step extends every live hypothesis by every token, keeps the 2*beam best extensions
by log-probability, and splits them: those ending in EOS (or reaching the sentence's length limit) compete
for the `beam` slots of the finished list, by length-penalised score; the others fill the `beam` live
slots. Because a live hypothesis contributes at most one EOS extension, at most `beam` of the 2*beam
candidates are finished, so the live beam never starves (tensor2tensor, flax examples/wmt, t5x).

Scores. score(Y) = log P(Y | X) / lp(|Y|), lp(n) = ((5 + n) / 6) ** alpha (GNMT) or n ** alpha (transformers'
generate: DecodeConfig.length_penalty='hf'), with |Y| counting the EOS (a hypothesis cut at its length limit counts
its tokens). The pad token is never generated.

Termination. A live hypothesis with log-probability s can at best finish with score s / max_n lp(n) over
the lengths n it can still reach (log-probabilities only fall as tokens are added; both penalties are monotone
in n, so the maximum is at one end of those lengths). When, for every sentence, that bound for the best live
hypothesis cannot beat the `nbest`-th best finished hypothesis, no further step can change the `nbest` best, and
the loop stops; otherwise it runs to the length limit. The search returns those `nbest` (default all `beam`):
asking for the 1-best stops sooner and gives the same 1-best.

Layout. The model sees hypotheses flattened to [batch * beam, ...] (rows of a sentence are adjacent, so a
batch-sharded cache keeps them on one device); search arrays are [batch, beam, ...].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.typing import ArrayLike

from transformer_jax import sharding
from transformer_jax.decoding.cache import Cache, reorder_cache
from transformer_jax.decoding.config import NEG_INF, DecodeConfig, length_penalty
from transformer_jax.decoding.driver import decode_in_segments, run_search
from transformer_jax.decoding.select import top_k
from transformer_jax.decoding.sentences import Sentences
from transformer_jax.decoding.steps import StepFn
from transformer_jax.layers.kv_cache import gather_beams


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


def sentences_done(
    state: BeamState, *, max_lengths: jnp.ndarray, alpha: float, nbest: int | None = None, penalty: str = "gnmt"
) -> jnp.ndarray:
    """[batch] bool: no live hypothesis of the sentence can still enter the `nbest` best of its finished list
    (default: all of it)."""
    index = state.step
    # The largest length penalty any live hypothesis can still reach: lp is monotone in the length, so it is
    # at one end of [index + 1, limit] (the limit for alpha >= 0).
    best_penalty = jnp.maximum(  # [batch]
        length_penalty(index + 1, alpha, penalty), length_penalty(max_lengths, alpha, penalty)
    )
    best_live = state.live_log_probs[:, 0]  # [batch]: sorted, the best first
    live_bound = best_live / best_penalty
    last = (nbest or state.finished_flags.shape[1]) - 1
    worst_finished = jnp.where(state.finished_flags[:, last], state.finished_scores[:, last], NEG_INF)
    return (worst_finished >= live_bound) | ~_is_valid(best_live) | (index >= max_lengths)


@dataclasses.dataclass(frozen=True)
class BeamSearch:
    """Beam search with these settings (hashable: a static argument of jit); `beam_size` rows per sentence.

    one_hot: reorder with one-hot matmuls (DecodeConfig.gather). early_stopping=False runs every sentence to its
    limit (the same result, for tests). nbest: how many of the best finished hypotheses are final when a sentence
    stops and are returned (None: beam_size). penalty: the length penalty's kind (DecodeConfig.length_penalty).
    """

    beam_size: int
    alpha: float
    bos_id: int
    eos_id: int
    pad_id: int
    one_hot: bool = False
    early_stopping: bool = True
    nbest: int | None = None
    penalty: str = "gnmt"

    def __post_init__(self):
        if self.nbest is not None and not 1 <= self.nbest <= self.beam_size:
            raise ValueError(f"nbest={self.nbest} must lie in [1, beam_size={self.beam_size}].")

    @property
    def rows_per_sentence(self) -> int:
        return self.beam_size

    def initial(self, cache: Cache, batch_size: int, max_decode_len: int) -> BeamState:
        batch, beam, length = batch_size, self.beam_size, max_decode_len
        # All beams of a sentence start identical; only slot 0 is live so they do not produce duplicates.
        return BeamState(
            step=jnp.array(0, jnp.int32),
            live_seqs=jnp.full((batch, beam, length), self.pad_id, jnp.int32),
            live_log_probs=jnp.tile(jnp.array([0.0] + [NEG_INF] * (beam - 1), jnp.float32), (batch, 1)),
            finished_seqs=jnp.full((batch, beam, length), self.pad_id, jnp.int32),
            finished_scores=jnp.full((batch, beam), NEG_INF, jnp.float32),
            finished_flags=jnp.zeros((batch, beam), bool),
            cache=cache,
        )

    def step(self, step_fn: StepFn, state: BeamState, sentences: Sentences) -> BeamState:
        batch, beam, length = state.live_seqs.shape
        index = state.step

        def gather(x, indices):
            return gather_beams(x, indices, one_hot=self.one_hot)

        # 1. Next-token logits of every live hypothesis.
        previous = jnp.take_along_axis(state.live_seqs, jnp.maximum(index - 1, 0)[None, None, None], axis=2)
        previous = jnp.where(index == 0, self.bos_id, previous[..., 0])  # [batch, beam]
        logits, cache = step_fn(previous.reshape(batch * beam), state.cache)  # [batch * beam, vocab]
        # 2. The 2*beam best extensions of all hypotheses: [batch, 2 * beam]. They lie among the 2*beam best
        # tokens of each hypothesis (plus pad, which is dropped), so one top-k over each row's logits (whose
        # order is the log-softmax's) cuts the search to [batch, beam * (2 * beam + 1)] candidates; no
        # [batch * beam, vocab] array of log-probabilities is written.
        # A forced prefix token is the only extension (the others are left out of the top-k, not renormalised).
        forcing, forced = sentences.forced(index)  # [batch]
        vocab = jnp.arange(logits.shape[-1], dtype=jnp.int32)
        barred = jnp.repeat(forcing[:, None] & (vocab != forced[:, None]), beam, axis=0)  # [batch * beam, vocab]
        per_row = min(2 * beam + 1, logits.shape[-1])  # a vocabulary smaller than that keeps every token
        row_logits, row_tokens = top_k(jnp.where(barred, NEG_INF, logits), per_row)  # [batch * beam, per_row]
        row_log_probs = row_logits - jax.nn.logsumexp(logits, axis=-1, keepdims=True)
        row_log_probs = jnp.where(row_tokens == self.pad_id, NEG_INF, row_log_probs)
        row_log_probs = row_log_probs.reshape(batch, beam, -1) + state.live_log_probs[:, :, None]
        candidates = row_log_probs.shape[-1]
        top_log_probs, top_flat = lax.top_k(row_log_probs.reshape(batch, beam * candidates), 2 * beam)
        top_parents = top_flat // candidates
        top_tokens = jnp.take_along_axis(row_tokens.reshape(batch, beam * candidates), top_flat, axis=1)
        top_seqs = gather(state.live_seqs, top_parents)  # [batch, 2 * beam, length]
        top_seqs = jnp.where(jnp.arange(length) == index, top_tokens[:, :, None], top_seqs)
        new_length = index + 1  # |Y|, EOS included
        ends = (top_tokens == self.eos_id) | (new_length >= sentences.limits)[:, None]  # [batch, 2 * beam]
        ends = ends & _is_valid(top_log_probs)

        # 3. Live: the best `beam` extensions that did not end. The cache follows its parents (reorder_cache).
        live_log_probs, live_pick = lax.top_k(jnp.where(ends, NEG_INF, top_log_probs), beam)  # [batch, beam]
        live_seqs = gather(top_seqs, live_pick)
        cache = reorder_cache(cache, jnp.take_along_axis(top_parents, live_pick, axis=1), one_hot=self.one_hot)

        # 4. Finished: merge the ended extensions into the finished list by length-penalised score.
        scores = jnp.where(ends, top_log_probs / length_penalty(new_length, self.alpha, self.penalty), NEG_INF)
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
            cache=cache,
        )

    def sentences_done(self, state: BeamState, sentences: Sentences) -> jnp.ndarray:
        """[batch] bool: the sentence's `nbest` best can no longer change (exact early termination)."""
        if not self.early_stopping:
            return state.step >= sentences.limits
        return sentences_done(
            state, max_lengths=sentences.limits, alpha=self.alpha, nbest=self.nbest, penalty=self.penalty
        )

    def outputs(self, state: BeamState) -> tuple[jnp.ndarray, jnp.ndarray]:
        """(sequences [batch, nbest, max_decode_len] pad after EOS, scores [batch, nbest]) best first; slots with
        no hypothesis (tiny vocabularies only) have score -inf and pad tokens."""
        # Every sentence ends at its limit with all live hypotheses finished, or stops early with its nbest final.
        flags = state.finished_flags[:, : self.nbest]  # [batch, nbest]
        sequences = jnp.where(flags[:, :, None], state.finished_seqs[:, : self.nbest], self.pad_id)
        return sequences, jnp.where(flags, state.finished_scores[:, : self.nbest], -jnp.inf)


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
    nbest: int | None = None,
    length_penalty: str = "gnmt",
    constrain: Callable[[Cache], Cache] = lambda cache: cache,
    cache_lengths: Sequence[int] | None = None,
    return_state: bool = False,
):
    """Beam search over any step function (traceable; call it inside jit).

    cache: leaves [batch * beam_size, ...] (rows of a sentence adjacent). max_lengths: [batch] per-sentence
    length limits (default max_decode_len). cache_lengths: the lengths a decode cache grows through
    (driver.growing_cache_loop; `cache` starts at the first), default (max_decode_len,). early_stopping=False
    runs every sentence to its limit (same result, for tests). nbest: the hypotheses returned, exact (default
    beam_size; 1 stops sooner). length_penalty: 'gnmt' or 'hf' (DecodeConfig.length_penalty). return_state=True
    also returns the final BeamState (e.g. `.step`, the steps run).
    Returns BeamSearch.outputs: (sequences [batch, nbest, max_decode_len] pad after EOS, scores [batch, nbest])
    best first.
    """
    search = BeamSearch(beam_size, alpha, bos_id, eos_id, pad_id, one_hot, early_stopping, nbest, length_penalty)
    final = run_search(search, step_fn, cache, batch_size, max_decode_len, max_lengths, constrain, cache_lengths)
    sequences, scores = search.outputs(final)
    return (sequences, scores, final) if return_state else (sequences, scores)


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
    rules: sharding.Rules = sharding.DEFAULT_RULES,
    early_stopping: bool = True,
    nbest: int | None = None,
    prefixes: Sequence[Sequence[int]] | None = None,
):
    """Beam search translation of `inputs` [batch, src_len] (pad_id = padding) with a Transformer.

    beam_size and alpha default to `config` (DecodeConfig: §6.1's beam 4, alpha 0.6). Each sentence's output
    is limited to its source length + config.extra_length, within the static buffer `max_decode_len` (default
    padded source width + extra_length, clipped to the model's max_len). The encoder runs once per sentence; its
    cross-attention keys/values are stored once per sentence and shared by its hypotheses, whose self-attention
    keys form one group per sentence (layers/kv_cache.KVCache). nbest: how many hypotheses to return (default
    beam_size); each sentence stops once its nbest best are final, so nbest=1 (a translation, not a list) decodes
    fewer steps and gives the same best hypothesis. prefixes: per sentence, target tokens every hypothesis starts
    with (forced; their log-probabilities counted).
    Returns (sequences [batch, nbest, max_decode_len], pad after EOS; scores [batch, nbest] =
    log P(Y | X) / lp(|Y|), |Y| counting EOS, lp config.length_penalty's), best first (numpy arrays).
    """
    config = DecodeConfig() if config is None else config
    beam_size = config.beam_size if beam_size is None else beam_size
    alpha = config.alpha if alpha is None else alpha
    if not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, got {beam_size!r}.")
    cfg = model.config
    search = BeamSearch(
        beam_size, float(alpha), cfg.bos_id, cfg.eos_id, cfg.pad_id, config.gather == "one_hot", early_stopping, nbest
    )
    search = dataclasses.replace(search, penalty=config.length_penalty)
    return decode_in_segments(
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
