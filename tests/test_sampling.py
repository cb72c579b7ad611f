"""Sampling, forced prefixes and reference scoring, against the softmax itself, brute force and teacher forcing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from test_decoding import BOS, EOS, PAD, SOURCES, TINY, random_params

from transformer_jax.decoding import (
    DecodeConfig,
    SamplingSearch,
    beam_search,
    greedy_decode,
    kept_logits,
    length_penalty,
    sample,
    token_log_probs,
)
from transformer_jax.decoding.config import NEG_INF
from transformer_jax.decoding.driver import run_search
from transformer_jax.model import Transformer
from transformer_jax.train.loss import cross_entropy_sums

VOCAB_LOGITS = np.array([3.0, -1.0, 0.5, 1.2, 0.0, -0.4, 0.9, -2.0], np.float32)  # pad 0 (most likely!), bos 1, eos 2


@pytest.fixture(scope="module")
def tiny():
    model = Transformer(TINY)
    return model, random_params(model, seed=1, scale=1.0)


def first_tokens(search: SamplingSearch) -> np.ndarray:
    """The first token of search.samples samples of one sentence whose step always gives VOCAB_LOGITS."""

    def search_over(logits):  # an argument, not a constant XLA would fold
        def step_fn(tokens, cache):
            return jnp.broadcast_to(logits, (tokens.shape[0], logits.shape[0])), cache

        return run_search(search, step_fn, {}, 1, 1, None, lambda c: c, None)

    final = jax.jit(search_over)(jnp.asarray(VOCAB_LOGITS))
    return np.asarray(final.tokens)[0, :, 0]  # [samples]


def expected(temperature: float, keep: list[int]) -> np.ndarray:
    """softmax(VOCAB_LOGITS / temperature) over the tokens `keep`, the rest 0."""
    probabilities = np.zeros_like(VOCAB_LOGITS, dtype=np.float64)
    scaled = np.exp(VOCAB_LOGITS[keep].astype(np.float64) / temperature)
    probabilities[keep] = scaled / scaled.sum()
    return probabilities


@pytest.mark.parametrize(
    "temperature, top_k, top_p, keep",
    [
        (1.0, 0, 1.0, [1, 2, 3, 4, 5, 6, 7]),  # every token but pad
        (0.6, 0, 1.0, [1, 2, 3, 4, 5, 6, 7]),
        (1.0, 3, 1.0, [3, 6, 2]),  # the three most probable after pad is barred
        (1.0, 0, 0.6, [3, 6]),  # p(3) = 0.346 < 0.6 <= p(3) + p(6) = 0.602 (pad barred)
    ],
)
def test_first_tokens_follow_the_kept_softmax(temperature, top_k, top_p, keep):
    draws = 6000
    tokens = first_tokens(SamplingSearch(draws, temperature, top_k, top_p, 0, BOS, EOS, PAD))
    counts = np.bincount(tokens, minlength=len(VOCAB_LOGITS))
    assert set(np.flatnonzero(counts)) <= set(keep), f"drew {set(np.flatnonzero(counts)) - set(keep)}"
    probabilities = expected(temperature, keep)
    statistic, p_value = stats.chisquare(counts[keep], draws * probabilities[keep])
    assert p_value > 1e-4, (counts, np.round(draws * probabilities))
    # The same test tells a wrong temperature apart: the counts are far from softmax(logits / (2 * temperature)).
    assert stats.chisquare(counts[keep], draws * expected(2 * temperature, keep)[keep])[1] < 1e-4


def brute_force_kept(row: np.ndarray, top_k: int, top_p: float) -> set[int]:
    order = sorted(range(len(row)), key=lambda i: -row[i])
    if top_k:
        order = order[:top_k]
    probabilities = np.exp(row[order] - row[order].max())
    probabilities /= probabilities.sum()
    kept, mass = [], 0.0
    for index, probability in zip(order, probabilities):
        if mass >= top_p:
            break
        kept.append(index)
        mass += probability
    return set(kept)


@pytest.mark.parametrize("top_k, top_p", [(0, 0.5), (0, 0.9), (5, 1.0), (5, 0.7), (1, 1.0), (0, 1e-6)])
def test_kept_tokens_are_the_brute_force_top_k_and_nucleus(top_k, top_p):
    rows = np.random.default_rng(0).normal(scale=2.0, size=(20, 30)).astype(np.float32)
    kept = np.asarray(kept_logits(jnp.asarray(rows), 1.0, top_k, top_p)) > NEG_INF / 2
    for row, mask in zip(rows, kept):
        assert set(np.flatnonzero(mask)) == brute_force_kept(row, top_k, top_p)


@pytest.mark.parametrize("flat_rows", [0, 1, 20])
@pytest.mark.parametrize("top_k, top_p", [(0, 0.9), (0, 0.5), (40, 0.9), (300, 0.95)])
def test_the_nucleus_of_a_large_vocabulary_is_brute_forces_peaked_or_flat(flat_rows, top_k, top_p):
    """Peaked rows keep a few tokens of 1000, flat ones (scale 0.3) hundreds, alone and in one batch."""
    rng = np.random.default_rng(flat_rows + top_k)
    scales = np.where(np.arange(20) < flat_rows, 0.3, 8.0)[:, None]
    rows = (rng.normal(size=(20, 1000)) * scales).astype(np.float32)
    kept = np.asarray(kept_logits(jnp.asarray(rows), 1.0, top_k, top_p)) > NEG_INF / 2
    sizes = []
    for row, mask in zip(rows, kept):
        assert set(np.flatnonzero(mask)) == brute_force_kept(row, top_k, top_p)
        sizes.append(mask.sum())
    assert (max(sizes) > 64) == (flat_rows > 0 and top_k != 40)


def test_temperature_zero_and_near_zero_give_greedy(tiny):
    model, params = tiny
    greedy, _, greedy_log_probs = greedy_decode(model, params, SOURCES, max_decode_len=6, return_log_probs=True)
    for temperature in (0.0, 1e-7):
        config = DecodeConfig(num_samples=2, temperature=temperature)
        tokens, _, log_probs = sample(model, params, SOURCES, config=config, max_decode_len=6)
        np.testing.assert_array_equal(tokens, np.repeat(greedy[:, None], 2, axis=1))
        np.testing.assert_allclose(log_probs, np.repeat(greedy_log_probs[:, None], 2, axis=1), rtol=1e-5)


def test_a_sentence_draws_the_same_alone_or_in_a_batch_and_its_score_is_teacher_forced(tiny):
    model, params = tiny
    config = DecodeConfig(num_samples=3, seed=5)
    tokens, lengths, log_probs = sample(model, params, SOURCES, config=config, sentence_ids=[7, 3], max_decode_len=6)
    alone, _, _ = sample(model, params, SOURCES[1:], config=config, sentence_ids=[3], max_decode_len=6)
    np.testing.assert_array_equal(alone[0], tokens[1])
    assert len({tuple(row) for row in tokens.reshape(-1, 6).tolist()}) > 1  # not one sequence repeated
    other_seed, _, _ = sample(
        model, params, SOURCES, config=config.replace(seed=6), sentence_ids=[7, 3], max_decode_len=6
    )
    assert not np.array_equal(other_seed, tokens)
    # log P(sample) as the search adds it up equals one teacher-forced pass over the sample.
    rows = np.repeat(np.asarray(SOURCES), 3, axis=0)  # [6, src_len]
    forced = np.asarray(token_log_probs(model, params, rows, tokens.reshape(6, 6))).sum(axis=1)
    np.testing.assert_allclose(log_probs.reshape(6), forced, rtol=1e-4, atol=1e-4)
    assert lengths.tolist() == (tokens != PAD).sum(axis=2).tolist()


def test_reference_scores_are_the_training_losss_nll_and_greedys_log_probs(tiny):
    model, params = tiny
    greedy, _, greedy_log_probs = greedy_decode(model, params, SOURCES, max_decode_len=6, return_log_probs=True)
    per_token = np.asarray(token_log_probs(model, params, SOURCES, greedy))  # [2, 6]
    np.testing.assert_allclose(per_token.sum(axis=1), greedy_log_probs, rtol=1e-5, atol=1e-5)
    targets = np.array([[3, 4, 5, EOS, PAD, PAD], [6, EOS, PAD, PAD, PAD, PAD]], np.int32)
    per_token = np.asarray(token_log_probs(model, params, SOURCES, targets))
    assert np.all(per_token[targets == PAD] == 0.0) and np.all(per_token[targets != PAD] < 0.0)
    decoder_inputs = np.concatenate([np.full((2, 1), BOS), targets[:, :-1]], axis=1)
    logits = model.apply({"params": params}, SOURCES, decoder_inputs)
    for row in range(2):
        sums = cross_entropy_sums(logits[row : row + 1], targets[row : row + 1], label_smoothing=0.0, pad_id=PAD)
        np.testing.assert_allclose(-per_token[row].sum(), float(sums.nll), rtol=1e-5)


def test_a_forced_prefix_starts_every_output_and_the_search_continues_it(tiny):
    model, params = tiny
    greedy, _ = greedy_decode(model, params, SOURCES, max_decode_len=6)
    # Greedy's own first two tokens as the prefix: the same output.
    own = [greedy[0, :2].tolist(), greedy[1, :2].tolist()]
    np.testing.assert_array_equal(greedy_decode(model, params, SOURCES, max_decode_len=6, prefixes=own)[0], greedy)
    # Another prefix: kept, and every later token is the argmax of a teacher-forced pass (pad barred).
    prefixes = [[5, 5], [4]]
    tokens, _, log_probs = greedy_decode(
        model, params, SOURCES, max_decode_len=6, prefixes=prefixes, return_log_probs=True
    )
    assert tokens[0, :2].tolist() == [5, 5] and tokens[1, 0] == 4
    logits = np.array(
        model.apply({"params": params}, SOURCES, np.concatenate([np.full((2, 1), BOS), tokens[:, :-1]], 1))
    )
    logits[:, :, PAD] = -np.inf
    argmax = np.argmax(logits, axis=-1)
    assert tokens[0, 2:].tolist() == argmax[0, 2:].tolist() and tokens[1, 1:].tolist() == argmax[1, 1:].tolist()
    np.testing.assert_allclose(log_probs, np.asarray(token_log_probs(model, params, SOURCES, tokens)).sum(1), rtol=1e-5)
    # Beam and sampling: every hypothesis starts with the prefix; a beam score is its log P / lp(|Y|).
    sequences, scores = beam_search(model, params, SOURCES, beam_size=3, max_decode_len=6, prefixes=prefixes)
    assert np.all(sequences[0, :, :2] == 5) and np.all(sequences[1, :, 0] == 4)
    for row in range(2):
        forced = np.asarray(token_log_probs(model, params, np.repeat(SOURCES[row : row + 1], 3, 0), sequences[row]))
        lengths = (sequences[row] != PAD).sum(axis=1)
        np.testing.assert_allclose(scores[row], forced.sum(1) / length_penalty(lengths, 0.6), rtol=1e-4)
    samples, _, _ = sample(
        model, params, SOURCES, config=DecodeConfig(num_samples=4), max_decode_len=6, prefixes=prefixes
    )
    assert np.all(samples[0, :, :2] == 5) and np.all(samples[1, :, 0] == 4)
