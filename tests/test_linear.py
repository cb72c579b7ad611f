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


def test_preferred_element_type_is_honoured():
    """bfloat16 operands with float32 results: the output of lax.dot_general with the same arguments."""
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(2, 3, 5)), jnp.bfloat16)
    kernel = jnp.asarray(rng.normal(size=(5, 4)), jnp.bfloat16)
    numbers = (((2,), (0,)), ((), ()))
    got = dense_dot_general(x, kernel, numbers, preferred_element_type=jnp.float32)
    want = jax.lax.dot_general(x, kernel, numbers, preferred_element_type=jnp.float32)
    assert got.dtype == want.dtype == jnp.float32
    np.testing.assert_array_equal(got, want)


def test_precision_reaches_every_matmul_forward_and_backward():
    """nn.Dense(precision=HIGHEST): each dot of the compiled value-and-gradient asks for HIGHEST.

    On a CPU float32 gives the same numbers at every precision, so the oracle is the lowered program.
    """
    x = jnp.ones((2, 3, 5), jnp.float32)
    layer = nn.Dense(4, precision=jax.lax.Precision.HIGHEST, dot_general=dense_dot_general)
    params = layer.init(jax.random.key(0), x)
    loss = lambda p, x: jnp.sum(layer.apply(p, x) ** 2)  # noqa: E731
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).as_text()
    dots = [line for line in text.splitlines() if "dot_general" in line]
    assert len(dots) == 3  # y = x W, d_W = x^T g, d_x = g W^T
    assert all("precision = [HIGHEST, HIGHEST]" in line for line in dots), dots
