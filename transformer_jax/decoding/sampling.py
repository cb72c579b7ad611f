"""Sampling: each output token drawn from the model's distribution, for back-translation (Edunov et al. 2018).

Per step and row: logits / temperature, cut to the top_k most probable tokens, then to the smallest set of them
whose probability reaches top_p (nucleus sampling, Holtzman et al. 2020), pad never allowed; one token drawn from
what is left (renormalised). temperature 0 is greedy. Each sentence's draws come from its own key,
fold_in(fold_in(PRNGKey(seed), sentence id), sample) folded with the step, so a sentence decodes the same samples in
any batch, alone, or in a run resumed after a kill. The score of a sample is log P(tokens | source) under the
model itself (temperature 1, nothing cut), as greedy's is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.typing import ArrayLike

from transformer_jax import sharding
from transformer_jax.decoding.cache import Cache
from transformer_jax.decoding.config import NEG_INF, DecodeConfig
from transformer_jax.decoding.driver import decode_in_segments
from transformer_jax.decoding.select import first_argmax, top_k
from transformer_jax.decoding.sentences import Sentences
from transformer_jax.decoding.steps import StepFn


class SamplingState(NamedTuple):
    step: jnp.ndarray  # [] tokens generated so far
    tokens: jnp.ndarray  # [batch, samples, max_decode_len] output, pad-filled
    done: jnp.ndarray  # [batch, samples] bool: emitted EOS or reached its length limit
    log_probs: jnp.ndarray  # [batch, samples] sum of log p(token) of the emitted tokens, under the model
    cache: Cache  # leaves [batch * samples, ...]


def kept_logits(logits: jnp.ndarray, temperature: float, top_k_size: int, top_p: float) -> jnp.ndarray:
    """[rows, vocab] logits / temperature with the tokens outside the top-k and the nucleus set to NEG_INF.

    top_k_size 0 keeps every token; top_p 1 keeps every token. The nucleus is the smallest set of most probable
    tokens (of those top-k left) whose probability reaches top_p; tokens tied with its least probable one stay.
    """
    scaled = logits / temperature
    if 0 < top_k_size < scaled.shape[-1]:
        kth = top_k(scaled, top_k_size)[0][:, -1:]  # [rows, 1]
        scaled = jnp.where(scaled >= kth, scaled, NEG_INF)
    if top_p < 1.0:
        keys = _float_keys(scaled)  # [rows, vocab]
        floor = _nucleus_floor(keys, jax.nn.softmax(scaled, axis=-1), top_p)  # [rows]
        scaled = jnp.where(keys > floor[:, None], scaled, NEG_INF)
    return scaled


def _float_keys(values: jnp.ndarray) -> jnp.ndarray:
    """uint32 keys in the order of the float32 `values` (equal floats, -0 and +0 too, share a key)."""
    bits = lax.bitcast_convert_type(jnp.where(values == 0, 0.0, values).astype(jnp.float32), jnp.uint32)
    negative = (bits >> 31) == 1
    return bits ^ jnp.where(negative, jnp.uint32(0xFFFFFFFF), jnp.uint32(0x80000000))


def _nucleus_floor(keys: jnp.ndarray, probs: jnp.ndarray, top_p: float) -> jnp.ndarray:
    """[rows] the key below each row's nucleus, from the logits' `_float_keys` and probabilities [rows, vocab]: the
    nucleus is the tokens whose key exceeds it.

    The nucleus's least probable token is the smallest logit v whose more probable tokens' mass, mass(> v), is below
    top_p; so the floor is the largest key K with mass(> K) >= top_p. mass(> K) only falls as K grows, so K is found
    bit by bit from the top, 32 masked sums over the vocabulary instead of a sort of it (exact: no tolerance).
    """

    def set_bit_if_mass_reaches(bit, floor):  # floor: [rows]
        candidate = floor | (jnp.uint32(1) << (31 - bit).astype(jnp.uint32))
        mass = jnp.sum(jnp.where(keys > candidate[:, None], probs, 0.0), axis=-1)  # [rows]
        return jnp.where(mass >= top_p, candidate, floor)

    return lax.fori_loop(0, 32, set_bit_if_mass_reaches, jnp.zeros(keys.shape[:1], jnp.uint32))


@dataclasses.dataclass(frozen=True)
class SamplingSearch:
    """Sampling with these settings (hashable: a static argument of jit); `samples` rows per sentence."""

    samples: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    bos_id: int
    eos_id: int
    pad_id: int

    def __post_init__(self):
        if not isinstance(self.samples, int) or self.samples < 1:
            raise ValueError(f"samples must be a positive integer, got {self.samples!r}.")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0: greedy), got {self.temperature!r}.")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be a non-negative integer (0: no cut), got {self.top_k!r}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1] (1: no cut), got {self.top_p!r}.")

    @property
    def rows_per_sentence(self) -> int:
        return self.samples

    def initial(self, cache: Cache, batch_size: int, max_decode_len: int) -> SamplingState:
        shape = (batch_size, self.samples)
        return SamplingState(
            step=jnp.array(0, jnp.int32),
            tokens=jnp.full((*shape, max_decode_len), self.pad_id, jnp.int32),
            done=jnp.zeros(shape, bool),
            log_probs=jnp.zeros(shape, jnp.float32),
            cache=cache,
        )

    def _keys(self, ids: jnp.ndarray, step: jnp.ndarray) -> jnp.ndarray:
        """[batch * samples] keys of this step: one stream per (sentence id, sample)."""
        root = jax.random.PRNGKey(self.seed)
        per_sentence = jax.vmap(lambda i: jax.random.fold_in(root, i))(ids)  # [batch, 2]
        per_sample = jax.vmap(lambda key: jax.vmap(lambda s: jax.random.fold_in(key, s))(jnp.arange(self.samples)))
        keys = per_sample(per_sentence).reshape(-1, per_sentence.shape[-1])  # [batch * samples, 2]
        return jax.vmap(lambda key: jax.random.fold_in(key, step))(keys)

    def step(self, step_fn: StepFn, state: SamplingState, sentences: Sentences) -> SamplingState:
        batch, samples, _ = state.tokens.shape
        previous = lax.dynamic_index_in_dim(state.tokens, jnp.maximum(state.step - 1, 0), axis=2, keepdims=False)
        previous = jnp.where(state.step == 0, self.bos_id, previous)  # [batch, samples]
        logits, cache = step_fn(previous.reshape(batch * samples), state.cache)  # [batch * samples, vocab] float32
        allowed = logits.at[:, self.pad_id].set(NEG_INF)  # pad is not a token a translation may contain
        if self.temperature == 0:
            drawn = first_argmax(allowed)[1]
        else:
            kept = kept_logits(allowed, self.temperature, self.top_k, self.top_p)
            drawn = jax.vmap(jax.random.categorical)(self._keys(sentences.ids, state.step), kept)
        drawn = drawn.reshape(batch, samples).astype(jnp.int32)
        forcing, forced = sentences.forced(state.step)
        token = jnp.where(forcing[:, None], forced[:, None], drawn)  # [batch, samples]
        log_probs = jax.nn.log_softmax(logits, axis=-1).reshape(batch, samples, -1)
        token_log_prob = jnp.take_along_axis(log_probs, token[:, :, None], axis=2)[:, :, 0]
        token = jnp.where(state.done, self.pad_id, token)
        position = jnp.arange(state.tokens.shape[2]) == state.step
        return SamplingState(
            step=state.step + 1,
            tokens=jnp.where(position, token[:, :, None], state.tokens),
            done=state.done | (token == self.eos_id) | (state.step + 1 >= sentences.limits)[:, None],
            log_probs=state.log_probs + jnp.where(state.done, 0.0, token_log_prob),
            cache=cache,
        )

    def sentences_done(self, state: SamplingState, sentences: Sentences) -> jnp.ndarray:
        """[batch] bool: every sample of the sentence has ended."""
        return jnp.all(state.done, axis=1)

    def outputs(self, state: SamplingState) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
        """(tokens [batch, samples, max_decode_len] pad after EOS, lengths [batch, samples] counting the EOS,
        log P(tokens) [batch, samples])."""
        return state.tokens, jnp.sum(state.tokens != self.pad_id, axis=-1).astype(jnp.int32), state.log_probs


def sample(
    model: nn.Module,
    params,
    inputs: ArrayLike,
    *,
    config: DecodeConfig | None = None,
    sentence_ids: ArrayLike | None = None,
    prefixes: Sequence[Sequence[int]] | None = None,
    max_decode_len: int | None = None,
    mesh: Mesh | None = None,
    rules: sharding.Rules = sharding.DEFAULT_RULES,
):
    """config.num_samples sampled translations of each of `inputs` [batch, src_len] (pad_id = padding) with a
    Transformer, drawn with config.temperature, top_k, top_p and seed (DecodeConfig).

    Lengths and the buffer as greedy_decode's. sentence_ids: [batch] the sentences' ids in their corpus (default
    0 .. batch-1): with the seed they decide the draws. prefixes: per sentence, target tokens every sample starts
    with. Returns (tokens [batch, samples, max_decode_len] pad after EOS, lengths [batch, samples] EOS counted,
    log P(tokens) [batch, samples]) as numpy arrays.
    """
    config = DecodeConfig() if config is None else config
    cfg = model.config
    search = SamplingSearch(
        config.num_samples,
        float(config.temperature),
        config.top_k,
        float(config.top_p),
        config.seed,
        cfg.bos_id,
        cfg.eos_id,
        cfg.pad_id,
    )
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
        sentence_ids=sentence_ids,
    )
