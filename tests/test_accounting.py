"""Parameter counts against the seed's arithmetic and Table 3; analytic FLOPs against XLA's own count."""

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


def test_a_matrix_of_more_than_2_to_the_31_entries_is_counted_whole():
    """A 4M-token vocabulary at d_model 2048: an embedding of 2**33 entries (int32 arithmetic would count 0)."""
    counted = count_parameters(tiny(vocab_size=2**22, d_model=2048, num_heads=4))
    assert counted.matrices["embed"] == 2**33


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
        (tiny(key_dim=4, value_dim=24), 4, 32, 48),  # d_k != d_v
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


def test_flops_by_hand_with_d_k_unlike_d_v():
    # h = 2 heads, d_k = 3, d_v = 5: each [tokens, d] @ [d, h * d_k or h * d_v] product term by term.
    cfg = tiny(num_encoder_layers=1, num_decoder_layers=1, d_model=4, num_heads=2, d_ff=8, vocab_size=10)
    cfg = cfg.replace(key_dim=3, value_dim=5)
    n, m, d, f, hk, hv = 3, 2, 4, 8, 2 * 3, 2 * 5
    flops = forward_flops(cfg, batch=1, src_len=n, tgt_len=m)

    def attention(queries, keys):
        projections = 2 * queries * d * hk + 2 * keys * d * hk + 2 * keys * d * hv + 2 * queries * hv * d  # Q K V O
        return projections + 2 * queries * keys * hk + 2 * queries * keys * hv  # Q K^T, weights x V

    assert flops["encoder"] == attention(n, n) + 4 * n * d * f
    assert flops["decoder"] == attention(m, m) + attention(m, n) + 4 * m * d * f


@pytest.mark.parametrize("key_dim, paper_difference", [(16, -7e6), (32, -5e6)])
def test_table3_row_b_smaller_keys_cost_what_the_paper_says(key_dim, paper_difference):
    """Row (B): d_k 16 or 32 at h = 8, d_v = 64: 58M and 60M against base's 65M in the paper."""
    base_total = count_parameters(base(vocab_size=37000)).total
    row = count_parameters(base(vocab_size=37000, key_dim=key_dim))
    # By hand: W^Q and W^K (2 projections) lose d_model x h x (64 - d_k) each in all 18 attention sub-layers
    # (6 encoder self, 6 decoder self, 6 decoder cross): d_k 16: 2 x 18 x 512 x 8 x 48 = 7,077,888;
    # d_k 32: 2 x 18 x 512 x 8 x 32 = 4,718,592.
    by_hand = -2 * 18 * 512 * 8 * (64 - key_dim)
    assert row.total - base_total == by_hand
    assert abs(by_hand - paper_difference) < 0.5e6


@pytest.mark.parametrize("num_heads", [1, 4, 16, 32])
def test_table3_row_a_more_heads_cost_nothing(num_heads):
    """Row (A): h heads of d_k = d_v = 512 / h keep base's parameters (§3.2.2: "the total computational cost is
    similar"), whether the sizes are given or default."""
    base_count = count_parameters(base(vocab_size=37000))
    size = 512 // num_heads
    for cfg in (
        base(vocab_size=37000, num_heads=num_heads),
        base(vocab_size=37000, num_heads=num_heads, key_dim=size, value_dim=size),
    ):
        count = count_parameters(cfg)
        assert (count.matrices, count.vectors) == (base_count.matrices, base_count.vectors)
