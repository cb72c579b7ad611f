"""layers.linear.dense: the numbers and gradients of a plain einsum (its VJP is hand-written)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.layers.linear import dense, dense_dot_general


def test_dense_value_and_gradients_match_einsum_autodiff():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(2, 3, 5)).astype(np.float32))  # [batch, length, d_in]
    kernel = jnp.asarray(rng.normal(size=(5, 4, 2)).astype(np.float32))  # [d_in, heads, head_dim]
    cotangent = jnp.asarray(rng.normal(size=(2, 3, 4, 2)).astype(np.float32))

    def reference(x, kernel):
        return jnp.einsum("bld,dhk->blhk", x, kernel)

    np.testing.assert_allclose(dense(x, kernel), reference(x, kernel), rtol=1e-6, atol=1e-6)
    ours = jax.vjp(dense, x, kernel)[1](cotangent)
    oracle = jax.vjp(reference, x, kernel)[1](cotangent)
    for got, want in zip(ours, oracle):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dense_general_with_our_dot_general_keeps_flax_numbers():
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 3, 4, 2)).astype(np.float32))
    layer = nn.DenseGeneral(features=6, axis=(-2, -1))
    params = layer.init(jax.random.key(0), x)
    ours = nn.DenseGeneral(features=6, axis=(-2, -1), dot_general=dense_dot_general)
    np.testing.assert_allclose(ours.apply(params, x), layer.apply(params, x), rtol=1e-6, atol=1e-6)
    grads = [jax.grad(lambda p, m=m: jnp.sum(m.apply(p, x) ** 2))(params) for m in (layer, ours)]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), *grads)
