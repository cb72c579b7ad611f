"""Parameter counts by component and analytic forward FLOPs of the model's matmuls (2 FLOPs per multiply-add)."""

from __future__ import annotations

import collections
import dataclasses
import math

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
        size = math.prod(leaf.shape)  # not jnp.prod: int32 wraps at 2**31 (a 4M x 2048 embedding counted 0)
        (matrices if len(leaf.shape) >= 2 else vectors)[component] += size
    return ParameterCount(dict(matrices), dict(vectors))


def forward_flops(config: ModelConfig, batch: int, src_len: int, tgt_len: int) -> dict[str, int]:
    """Forward FLOPs of one teacher-forced pass (2 FLOPs per multiply-add), by term.

    With a = h·(d_k + d_v) (= 2d when d_k = d_v = d / h, §3.2.2), per encoder layer with n source tokens:
    4·n·d·a (Q, K of h·d_k and V, O of h·d_v) + 4·n·d·d_ff (FFN) + 2·n²·a (scores Q·K^T and the weighted read of
    V); with the defaults and d_ff = 4d that is 24·n·d² + 4·n²·d. Per decoder layer with m target tokens: the same
    self-attention and FFN terms in m, plus cross-attention: 2·m·d·a (Q, O) + 2·n·d·a (K, V of the encoder
    output) + 2·m·n·a. Output projection: 2·m·d·vocab. LayerNorm, softmax and other element-wise work are left out.
    """
    d, d_ff, n, m = config.d_model, config.d_ff, src_len, tgt_len
    a = config.num_heads * (config.d_k + config.d_v)

    def self_attention(length):
        return 4 * length * d * a + 2 * length * length * a

    def ffn(length):
        return 4 * length * d * d_ff

    cross_attention = 2 * m * d * a + 2 * n * d * a + 2 * m * n * a
    terms = {
        "encoder": config.num_encoder_layers * (self_attention(n) + ffn(n)),
        "decoder": config.num_decoder_layers * (self_attention(m) + cross_attention + ffn(m)),
        "output_projection": 2 * m * d * config.vocab_size,
    }
    terms = {name: batch * value for name, value in terms.items()}
    terms["total"] = sum(terms.values())
    return terms
