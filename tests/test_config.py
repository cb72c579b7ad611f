"""ModelConfig validation and the paper's presets."""

import jax.numpy as jnp
import pytest

from transformer_jax.config import ModelConfig, base, big, tiny


def test_presets_are_table_3():
    b, g = base(), big()
    assert (b.num_encoder_layers, b.d_model, b.d_ff, b.num_heads, b.head_dim, b.dropout_rate) == (
        6,
        512,
        2048,
        8,
        64,
        0.1,
    )
    assert (g.num_encoder_layers, g.d_model, g.d_ff, g.num_heads, g.head_dim, g.dropout_rate) == (
        6,
        1024,
        4096,
        16,
        64,
        0.3,
    )
    assert b.norm_position == "post" and b.position_encoding == "sinusoidal" and b.share_embeddings
    assert b.attention_dropout_rate == 0.0 and b.relu_dropout_rate == 0.0
    assert tiny(d_model=32, num_heads=2).head_dim == 16


def test_key_and_value_sizes_default_to_d_model_over_heads():
    assert (base().d_k, base().d_v) == (64, 64)  # §3.2.2: d_k = d_v = d_model / h
    assert (base(key_dim=16).d_k, base(key_dim=16).d_v) == (16, 64)  # Table 3 row (B)
    explicit = tiny(d_model=30, num_heads=4, key_dim=8, value_dim=6)  # 30 / 4 is no size, both are given
    assert (explicit.d_k, explicit.d_v) == (8, 6)


def test_dtype_strings_are_accepted():
    cfg = tiny(dtype="bfloat16")
    assert cfg.dtype == jnp.bfloat16 and cfg.param_dtype == jnp.float32


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(d_model=512, num_heads=7), r"d_model=512 is not divisible by num_heads=7; choose num_heads"),
        (dict(vocab_size=0), r"vocab_size must be a positive integer"),
        (dict(d_ff=-1), r"d_ff must be a positive integer"),
        (dict(num_encoder_layers=0), r"num_encoder_layers must be a positive integer"),
        (dict(max_len=0), r"max_len must be a positive integer"),
        (dict(dropout_rate=1.0), r"dropout_rate=1.0 must lie in \[0, 1\)"),
        (dict(attention_dropout_rate=-0.1), r"attention_dropout_rate=-0.1 must lie in \[0, 1\)"),
        (dict(relu_dropout_rate=1.5), r"relu_dropout_rate=1.5 must lie in \[0, 1\)"),
        (dict(norm_position="sandwich"), r"norm_position='sandwich' is unknown; use one of \('post', 'pre'\)"),
        (dict(position_encoding="rotary"), r"position_encoding='rotary' is unknown; use one of"),
        (dict(sinusoid_layout="zigzag"), r"sinusoid_layout='zigzag' is unknown"),
        (dict(dtype="float33"), r"dtype='float33' is not a dtype"),
        (dict(layer_norm_epsilon=0.0), r"layer_norm_epsilon=0.0 must be positive"),
        (dict(pad_id=2), r"eos_id must differ from pad_id and bos_id"),
        (dict(activation="tanh"), r"activation='tanh' is unknown; use one of \('relu', 'swish', 'gelu'\)"),
        (dict(eos_id=37000), r"eos_id=37000 must lie in \[0, vocab_size=37000\)"),
        (dict(key_dim=0), r"key_dim must be a positive integer or None"),
        (dict(value_dim=2.5), r"value_dim must be a positive integer or None"),
        (dict(num_heads=7, key_dim=64), r"not divisible by num_heads=7; .* set both key_dim and value_dim"),
        (dict(key_dim=16, attention_impl="xla"), r"attention_impl='xla' needs keys and values of one size"),
    ],
)
def test_bad_config_says_what_to_change(overrides, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**overrides)
