"""Parameter counts against the seed's arithmetic; analytic FLOPs against XLA's own count."""

import jax
import jax.numpy as jnp
import pytest

from transformer_jax.accounting import count_parameters, forward_flops, parameter_shapes
from transformer_jax.config import base, big, tiny
from transformer_jax.model import Transformer


def matrix_weights_by_hand(vocab, d, d_ff, layers):
    embedding = vocab * d  # shared three ways (§3.4)
    encoder_layer = 4 * d * d + 2 * d * d_ff
    decoder_layer = 8 * d * d + 2 * d * d_ff
    return embedding + layers * (encoder_layer + decoder_layer)


def test_base_matrix_weights_exact():
    counted = count_parameters(base(vocab_size=37000))
    assert counted.matrix_total == matrix_weights_by_hand(37000, 512, 2048, 6) == 62_984_192
    assert counted.matrices == {"embed": 18_944_000, "encoder": 18_874_368, "decoder": 25_165_824}
    # Full total with FFN biases and LayerNorms; the paper's Table 3 says 65M.
    assert counted.total == 63_045_632


def test_big_matrix_weights_exact():
    counted = count_parameters(big(vocab_size=37000))
    assert counted.matrix_total == matrix_weights_by_hand(37000, 1024, 4096, 6) == 214_048_768
    assert counted.total == 214_171_648  # the paper's Table 3 says 213M


def test_attention_biases_and_unshared_embeddings_add_what_they_should():
    cfg = tiny()
    plain = count_parameters(cfg)
    biased = count_parameters(cfg.replace(attention_bias=True))
    layers_with_attention = cfg.num_encoder_layers + 2 * cfg.num_decoder_layers
    assert biased.total - plain.total == layers_with_attention * 4 * cfg.d_model
    unshared = count_parameters(cfg.replace(share_embeddings=False))
    assert unshared.matrix_total - plain.matrix_total == 2 * cfg.vocab_size * cfg.d_model


@pytest.mark.parametrize(
    "cfg, batch, src_len, tgt_len",
    [
        (tiny(), 8, 32, 32),
        (tiny(), 4, 64, 48),
        (base(vocab_size=37000), 2, 64, 64),
    ],
)
def test_analytic_flops_agree_with_xla(cfg, batch, src_len, tgt_len):
    model = Transformer(cfg)
    params = parameter_shapes(cfg)
    src = jax.ShapeDtypeStruct((batch, src_len), jnp.int32)
    tgt = jax.ShapeDtypeStruct((batch, tgt_len), jnp.int32)
    compiled = jax.jit(lambda p, s, t: model.apply({"params": p}, s, t)).lower(params, src, tgt).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    analytic = forward_flops(cfg, batch, src_len, tgt_len)
    assert analytic["total"] == sum(v for k, v in analytic.items() if k != "total")
    assert abs(analysis["flops"] / analytic["total"] - 1.0) < 0.10


def test_flops_by_hand_for_one_tiny_layer():
    cfg = tiny(num_encoder_layers=1, num_decoder_layers=1, d_model=4, num_heads=1, d_ff=8, vocab_size=10)
    n, m, d, f = 3, 2, 4, 8
    flops = forward_flops(cfg, batch=1, src_len=n, tgt_len=m)
    assert flops["encoder"] == 8 * n * d * d + 4 * n * n * d + 4 * n * d * f
    assert (
        flops["decoder"]
        == (8 * m * d * d + 4 * m * m * d) + (4 * m * d * d + 4 * n * d * d + 4 * m * n * d) + 4 * m * d * f
    )
    assert flops["output_projection"] == 2 * m * d * 10
