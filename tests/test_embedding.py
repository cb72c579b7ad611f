"""Sinusoidal positions (§3.5) and the scaled, shared embedding (§3.4)."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.config import tiny
from transformer_jax.layers.embedding import TokenEmbedding, sinusoidal_table


def test_table_matches_formula_element_by_element():
    max_len, d_model = 50, 16
    table = sinusoidal_table(max_len, d_model)
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert math.isclose(table[pos, 2 * i], math.sin(angle), abs_tol=1e-6)
            assert math.isclose(table[pos, 2 * i + 1], math.cos(angle), abs_tol=1e-6)


def test_halves_layout_is_a_permutation_of_interleaved():
    interleaved, halves = sinusoidal_table(20, 8), sinusoidal_table(20, 8, "halves")
    np.testing.assert_array_equal(halves, np.concatenate([interleaved[:, 0::2], interleaved[:, 1::2]], axis=1))


def test_relative_position_is_a_rotation_depending_only_on_offset():
    d_model, table = 16, sinusoidal_table(200, 16).astype(np.float64)
    for k in (1, 5, 17):
        for i in range(d_model // 2):
            omega = 1.0 / 10000 ** (2 * i / d_model)
            rotation = np.array([[np.cos(k * omega), np.sin(k * omega)], [-np.sin(k * omega), np.cos(k * omega)]])
            for pos in (0, 3, 60, 150):
                pair = table[pos, 2 * i : 2 * i + 2]
                np.testing.assert_allclose(rotation @ pair, table[pos + k, 2 * i : 2 * i + 2], atol=1e-5)


def test_embedding_scaled_by_sqrt_d_model_and_tied_logits():
    cfg = tiny()
    module = TokenEmbedding(cfg)
    tokens = jnp.array([[3, 7]])
    params = nn.unbox(module.init(jax.random.key(0), tokens)["params"])
    matrix = np.asarray(params["embedding"])
    np.testing.assert_allclose(
        module.apply({"params": params}, tokens)[0], matrix[[3, 7]] * math.sqrt(cfg.d_model), rtol=1e-6
    )
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 2, cfg.d_model)), jnp.bfloat16)
    logits = module.apply({"params": params}, x, method=TokenEmbedding.attend)
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(logits[0], np.asarray(x[0], np.float32) @ matrix.T, rtol=1e-5, atol=1e-5)
