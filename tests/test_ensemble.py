"""Ensembles: a model with itself is the model; two models follow the mean of their probabilities (brute force)."""

import jax
import numpy as np
import pytest
from test_decoding import BOS, PAD, SOURCES, TINY, random_params

from transformer_jax.decoding import (
    DecodeConfig,
    Ensemble,
    beam_search,
    ensemble_params,
    greedy_decode,
    sample,
    token_log_probs,
)
from transformer_jax.model import Transformer


@pytest.fixture(scope="module")
def two():
    model = Transformer(TINY)
    return model, random_params(model, seed=1, scale=1.0), random_params(model, seed=2, scale=1.0)


def test_an_ensemble_of_a_model_with_itself_decodes_as_the_model(two):
    model, params, _ = two
    ensemble, both = Ensemble((TINY, TINY)), ensemble_params([params, params])
    tokens, _, log_probs = greedy_decode(model, params, SOURCES, max_decode_len=6, return_log_probs=True)
    same, _, same_log_probs = greedy_decode(ensemble, both, SOURCES, max_decode_len=6, return_log_probs=True)
    np.testing.assert_array_equal(same, tokens)
    np.testing.assert_allclose(same_log_probs, log_probs, rtol=1e-5, atol=1e-5)
    sequences, scores = beam_search(model, params, SOURCES, beam_size=3, max_decode_len=6)
    same_sequences, same_scores = beam_search(ensemble, both, SOURCES, beam_size=3, max_decode_len=6)
    np.testing.assert_array_equal(same_sequences, sequences)
    np.testing.assert_allclose(same_scores, scores, rtol=1e-5, atol=1e-5)
    config = DecodeConfig(num_samples=3, seed=4)
    np.testing.assert_array_equal(
        sample(ensemble, both, SOURCES, config=config, max_decode_len=6)[0],
        sample(model, params, SOURCES, config=config, max_decode_len=6)[0],
    )


def mixture_log_probs(model, members, tokens):
    """[batch, len, vocab] log of the members' mean probability, each from a teacher-forced pass over `tokens`."""
    decoder_inputs = np.concatenate([np.full((tokens.shape[0], 1), BOS), tokens[:, :-1]], axis=1)
    probabilities = [
        np.exp(np.asarray(jax.nn.log_softmax(model.apply({"params": p}, SOURCES, decoder_inputs), axis=-1), np.float64))
        for p in members
    ]
    return np.log(np.mean(probabilities, axis=0))


def test_two_models_follow_the_mean_of_their_probabilities(two):
    model, first, second = two
    ensemble, both = Ensemble((TINY, TINY)), ensemble_params([first, second])
    tokens, _, log_probs = greedy_decode(ensemble, both, SOURCES, max_decode_len=6, return_log_probs=True)
    mixture = mixture_log_probs(model, [first, second], tokens)  # [2, 6, vocab]
    barred = mixture.copy()
    barred[:, :, PAD] = -np.inf
    np.testing.assert_array_equal(np.argmax(barred, axis=-1), tokens)  # each token the mixture's argmax
    picked = np.take_along_axis(mixture, tokens[:, :, None], axis=2)[:, :, 0]
    np.testing.assert_allclose(log_probs, picked.sum(axis=1), rtol=1e-5)
    alone = [greedy_decode(model, p, SOURCES, max_decode_len=6)[0] for p in (first, second)]
    assert not all(np.array_equal(tokens, a) for a in alone)  # the ensemble is neither model
    np.testing.assert_allclose(
        np.asarray(token_log_probs(ensemble, both, SOURCES, tokens)), picked, rtol=1e-5, atol=1e-6
    )


def test_models_with_other_vocabularies_are_refused(two):
    model, first, _ = two
    other = TINY.replace(vocab_size=12)
    with pytest.raises(ValueError, match="differs from model 0 in vocab_size"):
        greedy_decode(Ensemble((TINY, other)), ensemble_params([first, first]), SOURCES, max_decode_len=6)
