"""Attention against the seed's worked numbers and brute force."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.config import tiny
from transformer_jax.layers.attention import MultiHeadAttention, attention_weights, dot_product_attention
from transformer_jax.layers.masks import causal_mask, combine_masks, padding_mask, segment_mask


def as_heads(matrix):
    """[length, dim] -> [batch=1, length, heads=1, dim]."""
    return jnp.asarray(matrix, jnp.float32)[None, :, None, :]


def test_seed_worked_example_cat_sat_on_mat():
    # Seed 1 (猫坐垫): q = [1, 0], K = [[1,0],[0,1],[1,1]], V = [[2,0],[0,2],[2,2]], d_k = 2.
    q, k, v = as_heads([[1, 0]]), as_heads([[1, 0], [0, 1], [1, 1]]), as_heads([[2, 0], [0, 2], [2, 2]])
    weights = attention_weights(q, k)[0, 0, 0]
    output = dot_product_attention(q, k, v)[0, 0, 0]
    np.testing.assert_allclose(np.round(weights, 4), [0.4011, 0.1978, 0.4011])
    np.testing.assert_allclose(np.round(output, 4), [1.6044, 1.1978])


def test_weights_are_the_softmax_of_scaled_scores_by_hand():
    # d_k = 4, so Q K^T / sqrt(d_k) = [2, 4, 6] / 2 = [1, 2, 3]; softmax by hand: e^i / (e + e^2 + e^3).
    q = jnp.ones((1, 1, 1, 4))  # [batch, q_len, heads, head_dim]
    k = jnp.array([0.5, 1.0, 1.5])[None, :, None, None] * jnp.ones((1, 3, 1, 4))  # [batch, kv_len, heads, head_dim]
    by_hand = [math.exp(i) / (math.exp(1) + math.exp(2) + math.exp(3)) for i in (1, 2, 3)]
    np.testing.assert_allclose(attention_weights(q, k)[0, 0, 0], by_hand, rtol=1e-6)


def test_matches_brute_force_with_mask():
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, l, 3, 4)).astype(np.float32) for l in (5, 7, 7))
    mask = rng.random((2, 3, 5, 7)) > 0.3
    mask[..., 0] = True
    got = dot_product_attention(q, k, v, mask)
    expected = np.zeros_like(q)
    for b in range(2):
        for h in range(3):
            for i in range(5):
                scores = np.array([q[b, i, h] @ k[b, j, h] / 2.0 for j in range(7)])
                scores = np.where(mask[b, h, i], scores, -np.inf)
                p = np.exp(scores - scores.max())
                p /= p.sum()
                expected[b, i, h] = p @ v[b, :, h]
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_fully_masked_row_gives_zeros_not_nan():
    q = k = v = jnp.ones((1, 2, 1, 4))
    mask = jnp.array([[[[True, True], [False, False]]]])
    out = dot_product_attention(q, k, v, mask)
    assert not np.isnan(np.asarray(out)).any()
    np.testing.assert_array_equal(out[0, 1], 0.0)
    np.testing.assert_allclose(out[0, 0], 1.0)


def test_mask_applied_before_softmax_renormalises():
    # Masking after the softmax would leave weights summing to < 1; before it they sum to exactly 1.
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(1, 3, 2, 8)), rng.normal(size=(1, 4, 2, 8))
    mask = jnp.array([True, True, False, True])[None, None, None, :]
    weights = attention_weights(jnp.asarray(q), jnp.asarray(k), mask)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(weights[..., 2], 0.0)


def test_bf16_inputs_softmax_in_float32():
    q = jnp.ones((1, 2, 1, 4), jnp.bfloat16)
    assert attention_weights(q, q).dtype == jnp.float32
    assert dot_product_attention(q, q, q).dtype == jnp.bfloat16


def test_masks_by_hand():
    tokens = jnp.array([[5, 6, 0]])
    np.testing.assert_array_equal(
        padding_mask(tokens, tokens, pad_id=0)[0, 0],
        [[1, 1, 0], [1, 1, 0], [0, 0, 0]],
    )
    np.testing.assert_array_equal(causal_mask(3)[0, 0], [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    segments = jnp.array([[1, 1, 2, 0]])
    np.testing.assert_array_equal(
        segment_mask(segments, segments)[0, 0],
        [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
    )
    assert combine_masks(None, None) is None
    combined = combine_masks(causal_mask(4), segment_mask(segments, segments))[0, 0]
    np.testing.assert_array_equal(combined, [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])


@pytest.mark.parametrize("rate", [0.0, 0.5])
def test_attention_dropout_keeps_expectation(rate):
    q = k = v = jnp.asarray(np.random.default_rng(2).normal(size=(1, 4, 1, 8)), jnp.float32)
    outs = jnp.stack(
        [
            dot_product_attention(q, k, v, dropout_rate=rate, dropout_rng=jax.random.key(i), deterministic=False)
            for i in range(400)
        ]
    )
    np.testing.assert_allclose(outs.mean(0), dot_product_attention(q, k, v), atol=0.15)


def test_multi_head_attention_with_d_k_unlike_d_v_equals_numpy_by_hand():
    """§3.2.2 with d_k = 3 != d_v = 5 (d_model / h = 4): head i is softmax(x W_i^Q (m W_i^K)^T / sqrt(d_k)) m W_i^V,
    and the output is the concatenation of the heads times W^O, here summed head by head in numpy."""
    cfg = tiny(d_model=8, num_heads=2, key_dim=3, value_dim=5)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(1, 4, 8)).astype(np.float32)  # [batch, q_len, d_model]
    memory = rng.normal(size=(1, 6, 8)).astype(np.float32)  # [batch, kv_len, d_model]
    mask = rng.random((1, 1, 4, 6)) > 0.3
    mask[..., 0] = True
    attention = MultiHeadAttention(cfg)
    params = jax.tree.map(np.asarray, nn.unbox(attention.init(jax.random.key(0), x, memory, mask)["params"]))
    shapes = {name: params[name]["kernel"].shape for name in ("query", "key", "value", "out")}
    assert shapes == {"query": (8, 2, 3), "key": (8, 2, 3), "value": (8, 2, 5), "out": (2, 5, 8)}

    expected = np.zeros((4, 8))
    for head in range(2):
        q = x[0] @ params["query"]["kernel"][:, head]  # [4, d_k]
        k = memory[0] @ params["key"]["kernel"][:, head]  # [6, d_k]
        v = memory[0] @ params["value"]["kernel"][:, head]  # [6, d_v]
        scores = np.where(mask[0, 0], q @ k.T / math.sqrt(3), -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        expected += (p / p.sum(-1, keepdims=True)) @ v @ params["out"]["kernel"][head]  # [4, d_v] @ [d_v, d_model]
    got = attention.apply({"params": params}, x, memory, mask)
    np.testing.assert_allclose(got[0], expected, rtol=1e-5, atol=1e-5)
