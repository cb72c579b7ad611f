"""The layers stand alone: a small non-Transformer Flax model uses them and trains."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer_jax.config import ModelConfig
from transformer_jax.layers.attention import MultiHeadAttention
from transformer_jax.layers.feedforward import FeedForward


class SetClassifier(nn.Module):
    """Attention-pooled classifier over a set of vectors: not a Transformer, just its parts."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x):  # x: [batch, items, d_model]
        x = x + MultiHeadAttention(self.config)(x)
        x = x + FeedForward(self.config)(x)
        return nn.Dense(2)(x.mean(axis=1))  # [batch, 2]


@pytest.mark.rounding
def test_layers_train_inside_another_model():
    cfg = ModelConfig(vocab_size=8, d_model=16, num_heads=2, d_ff=32, dropout_rate=0.0)
    model = SetClassifier(cfg)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(32, 5, 16)), jnp.float32)
    labels = jnp.asarray((x[:, :, 0].sum(1) > 0).astype(np.int32))
    params = nn.unbox(model.init(jax.random.key(0), x)["params"])
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(params)

    def loss_fn(p):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": p}, x), labels).mean()

    @jax.jit
    def step(p, s):
        loss, grads = jax.value_and_grad(loss_fn)(p)
        updates, s = optimizer.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss

    first = loss_fn(params)
    for _ in range(30):
        params, opt_state, loss = step(params, opt_state)
    assert set(params) == {"MultiHeadAttention_0", "FeedForward_0", "Dense_0"}
    assert loss < 0.5 * first
