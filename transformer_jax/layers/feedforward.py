"""Position-wise feed-forward network (§3.3): FFN(x) = max(0, x W1 + b1) W2 + b2 (or swish / gelu for max(0, .))."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from transformer_jax.config import ModelConfig
from transformer_jax.layers.init import bias_init, kernel_init
from transformer_jax.layers.linear import dense_dot_general

ACTIVATION_FNS = {
    "relu": nn.relu,
    "swish": nn.swish,
    "gelu": lambda x: nn.gelu(x, approximate=False),
}


class FeedForward(nn.Module):
    """Two linear maps with a ReLU (config.activation) between, applied to every position alike."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x: jnp.ndarray, deterministic: bool = True) -> jnp.ndarray:
        cfg = self.config
        # x: [batch, length, d_model]
        hidden = nn.Dense(
            cfg.d_ff,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            name="wi",
            dot_general=dense_dot_general,
            kernel_init=kernel_init(("embed", "mlp")),
            bias_init=bias_init(("mlp",)),
        )(x)  # [batch, length, d_ff]
        hidden = ACTIVATION_FNS[cfg.activation](hidden)
        hidden = nn.Dropout(rate=cfg.relu_dropout_rate)(hidden, deterministic=deterministic)
        return nn.Dense(
            cfg.d_model,
            dtype=cfg.dtype,
            param_dtype=cfg.param_dtype,
            name="wo",
            dot_general=dense_dot_general,
            kernel_init=kernel_init(("mlp", "embed")),
            bias_init=bias_init(("embed",)),
        )(hidden)  # [batch, length, d_model]
