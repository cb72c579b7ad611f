"""decoding/select.py against its oracles, lax.top_k and jnp.argmax, on ties, -inf rows and ragged chunks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from transformer_jax.decoding.select import first_argmax, log_normaliser, top_k


def tied_logits(rows: int, vocab: int, seed: int) -> np.ndarray:
    """Few distinct values, so that most rows tie at the maximum and inside the top k."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 6, (rows, vocab)).astype(np.float32)
    x[0] = 0.0  # one row all equal
    x[1, :] = -1e9
    x[1, vocab - 3 :] = 2.0  # the best entries in the last (ragged) chunk
    return x


@pytest.mark.parametrize("vocab", [8000, 1000, 67, 50])
@pytest.mark.parametrize("k", [1, 9])
def test_top_k_matches_lax_top_k_with_ties(vocab, k):
    x = jnp.asarray(tied_logits(16, vocab, seed=vocab + k))
    values, indices = jax.jit(top_k, static_argnums=1)(x, k)
    expected_values, expected_indices = lax.top_k(x, k)
    np.testing.assert_array_equal(values, expected_values)
    np.testing.assert_array_equal(indices, expected_indices)


def test_top_k_on_distinct_values_and_small_chunks():
    x = jax.random.normal(jax.random.key(0), (3, 5, 700))
    values, indices = top_k(x, 4, chunk=8)
    expected_values, expected_indices = lax.top_k(x, 4)
    np.testing.assert_array_equal(values, expected_values)
    np.testing.assert_array_equal(indices, expected_indices)
    assert indices.dtype == jnp.int32


def test_top_k_breaks_when_the_chunk_order_is_not_kept():
    """The test can fail: the same two stages without sorting the chosen chunks give other tie orders."""
    x = jnp.asarray(tied_logits(16, 1000, seed=3))
    blocks = x.reshape(16, -1, 8)
    _, best = lax.top_k(jnp.max(blocks, -1), 5)
    best = best[:, ::-1]  # chunks in the reverse order
    candidates = jnp.take_along_axis(blocks, best[..., None], axis=-2).reshape(16, -1)
    _, position = lax.top_k(candidates, 5)
    wrong = jnp.take_along_axis(best, position // 8, axis=-1) * 8 + position % 8
    assert not np.array_equal(wrong, lax.top_k(x, 5)[1])
    np.testing.assert_array_equal(top_k(x, 5, chunk=8)[1], lax.top_k(x, 5)[1])


def test_first_argmax_matches_argmax_with_ties():
    x = jnp.asarray(tied_logits(32, 8000, seed=1))
    best, index = jax.jit(first_argmax)(x)
    np.testing.assert_array_equal(index, jnp.argmax(x, axis=-1))
    np.testing.assert_array_equal(best, jnp.max(x, axis=-1))


def test_log_normaliser_is_logsumexp():
    x = jax.random.normal(jax.random.key(1), (7, 8000)) * 5
    x = x.at[0].set(-jnp.inf).at[1, 3].set(jnp.inf)
    row_max = jnp.max(x, axis=-1)
    got = jax.jit(log_normaliser)(x, row_max)
    np.testing.assert_array_equal(got, jax.jit(lambda x: jax.nn.logsumexp(x, axis=-1))(x))
