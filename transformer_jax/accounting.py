"""Parameter counts by component and analytic forward FLOPs of the model's matmuls (2 FLOPs per multiply-add)."""

from __future__ import annotations

import collections
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.config import ModelConfig
from transformer_jax.model import Transformer


def parameter_shapes(config: ModelConfig) -> dict:
    """The parameter tree as ShapeDtypeStructs, without allocating or computing anything."""
    tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
    variables = jax.eval_shape(Transformer(config).init, jax.random.key(0), tokens, tokens)
    return nn.unbox(variables["params"])


@dataclasses.dataclass(frozen=True)
class ParameterCount:
    """Parameters per component, split into matrices (kernels, embeddings) and vectors (biases, LayerNorm)."""

    matrices: dict[str, int]
    vectors: dict[str, int]

    @property
    def matrix_total(self) -> int:
        return sum(self.matrices.values())

    @property
    def total(self) -> int:
        return self.matrix_total + sum(self.vectors.values())


def count_parameters(config: ModelConfig) -> ParameterCount:
    """Counts the model's parameters by top-level component (embeddings, encoder, decoder, ...)."""
    matrices: dict[str, int] = collections.Counter()
    vectors: dict[str, int] = collections.Counter()
    for path, leaf in jax.tree_util.tree_leaves_with_path(parameter_shapes(config)):
        component = path[0].key
        size = int(jnp.prod(jnp.array(leaf.shape)))
        (matrices if len(leaf.shape) >= 2 else vectors)[component] += size
    return ParameterCount(dict(matrices), dict(vectors))


def forward_flops(config: ModelConfig, batch: int, src_len: int, tgt_len: int) -> dict[str, int]:
    """Forward FLOPs of one teacher-forced pass (2 FLOPs per multiply-add), by term.

    Per encoder layer with n source tokens: 8·n·d² (Q, K, V, O projections) + 4·n·d·d_ff (FFN) + 4·n²·d
    (scores Q·K^T and the weighted read of V); with d_ff = 4d the projections and FFN together are 24·n·d².
    Per decoder layer with m target tokens: the same self-attention and FFN terms in m, plus
    cross-attention: 4·m·d² (Q, O) + 4·n·d² (K, V of the encoder output) + 4·m·n·d.
    Output projection: 2·m·d·vocab. LayerNorm, softmax and other element-wise work are left out.
    """
    d, d_ff, n, m = config.d_model, config.d_ff, src_len, tgt_len

    def self_attention(length):
        return 8 * length * d * d + 4 * length * length * d

    def ffn(length):
        return 4 * length * d * d_ff

    cross_attention = 4 * m * d * d + 4 * n * d * d + 4 * m * n * d
    terms = {
        "encoder": config.num_encoder_layers * (self_attention(n) + ffn(n)),
        "decoder": config.num_decoder_layers * (self_attention(m) + cross_attention + ffn(m)),
        "output_projection": 2 * m * d * config.vocab_size,
    }
    terms = {name: batch * value for name, value in terms.items()}
    terms["total"] = sum(terms.values())
    return terms
