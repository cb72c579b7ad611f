"""Token embeddings scaled by sqrt(d_model) and shared with the output projection (§3.4); positions (§3.5)."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from transformer_jax.config import ModelConfig
from transformer_jax.layers.linear import dense


def sinusoidal_table(max_len: int, d_model: int, layout: str = "interleaved") -> np.ndarray:
    """[max_len, d_model] table of §3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...).

    layout='interleaved' is the paper's; 'halves' puts all sines first, then all cosines (tensor2tensor).
    """
    positions = np.arange(max_len, dtype=np.float64)[:, None]  # [max_len, 1]
    frequencies = 1.0 / 10000.0 ** (np.arange(0, d_model, 2, dtype=np.float64) / d_model)  # [d_model/2]
    angles = positions * frequencies[None, :]  # [max_len, d_model/2]
    table = np.empty((max_len, d_model), dtype=np.float64)
    if layout == "interleaved":
        table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
    elif layout == "halves":
        half = d_model // 2
        table[:, :half], table[:, half:] = np.sin(angles), np.cos(angles)
    else:
        raise ValueError(f"unknown sinusoid layout {layout!r}; use 'interleaved' or 'halves'.")
    return table.astype(np.float32)


class TokenEmbedding(nn.Module):
    """Embedding lookup times sqrt(d_model); `attend` reuses the matrix for float32 output logits."""

    config: ModelConfig

    def setup(self):
        cfg = self.config
        self.embedding = self.param(
            "embedding",
            nn.with_logical_partitioning(nn.initializers.normal(stddev=cfg.d_model**-0.5), ("vocab", "embed")),
            (cfg.vocab_size, cfg.d_model),
            cfg.param_dtype,
        )  # [vocab, d_model]

    def __call__(self, tokens: jnp.ndarray) -> jnp.ndarray:
        cfg = self.config
        embedded = jnp.take(self.embedding, tokens, axis=0)  # [batch, length, d_model]
        return (embedded * jnp.sqrt(jnp.float32(cfg.d_model))).astype(cfg.dtype)

    def attend(self, x: jnp.ndarray) -> jnp.ndarray:
        """Pre-softmax projection with the transposed embedding: [batch, length, d_model] -> [..., vocab]."""
        return dense(x.astype(jnp.float32), self.embedding.astype(jnp.float32).T)  # [batch, length, vocab]


class PositionalEncoding(nn.Module):
    """Adds position information: the fixed sinusoids of §3.5 or a learned table (Table 3 row E)."""

    config: ModelConfig

    @nn.compact
    def __call__(self, positions: jnp.ndarray) -> jnp.ndarray:
        """positions: [batch, length] int -> [batch, length, d_model]."""
        cfg = self.config
        if cfg.position_encoding == "sinusoidal":
            table = jnp.asarray(sinusoidal_table(cfg.max_len, cfg.d_model, cfg.sinusoid_layout))
        else:
            table = self.param(  # type: ignore[assignment]  # the unboxed array under nn.compact
                "position_embedding",
                nn.with_logical_partitioning(nn.initializers.normal(stddev=cfg.d_model**-0.5), (None, "embed")),
                (cfg.max_len, cfg.d_model),
                cfg.param_dtype,
            )  # [max_len, d_model]
        return jnp.take(table, positions, axis=0).astype(cfg.dtype)
