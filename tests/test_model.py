"""Whole-model properties: permutation equivariance, causality, padding invariance, dtypes, variants."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.config import tiny
from transformer_jax.model import Transformer

SRC = jnp.array([[5, 9, 12, 7, 30, 2], [8, 4, 2, 0, 0, 0]])  # [batch=2, src_len=6]
TGT_IN = jnp.array([[1, 40, 41, 42, 43], [1, 17, 18, 0, 0]])  # [batch=2, tgt_len=5]


def init(cfg, src=SRC, tgt=TGT_IN):
    model = Transformer(cfg)
    return model, nn.unbox(model.init(jax.random.key(0), src, tgt)["params"])


def test_logits_shape_and_dtype():
    model, params = init(tiny())
    logits = model.apply({"params": params}, SRC, TGT_IN)
    assert logits.shape == (2, 5, 512) and logits.dtype == jnp.float32


def test_encoder_is_permutation_equivariant_without_positions():
    # Learned positions set to zero = no positional information.
    model, params = init(tiny(position_encoding="learned"))
    params["encoder"]["positions"]["position_embedding"] = jnp.zeros_like(
        params["encoder"]["positions"]["position_embedding"]
    )
    src = SRC[:1]
    permutation = np.array([3, 0, 5, 1, 4, 2])
    encoded = model.apply({"params": params}, src, method=Transformer.encode)
    encoded_permuted = model.apply({"params": params}, src[:, permutation], method=Transformer.encode)
    np.testing.assert_allclose(encoded_permuted, encoded[:, permutation], atol=1e-5)


def test_with_positions_permutation_changes_the_output():
    model, params = init(tiny())
    permutation = np.array([3, 0, 5, 1, 4, 2])
    encoded = model.apply({"params": params}, SRC[:1], method=Transformer.encode)
    encoded_permuted = model.apply({"params": params}, SRC[:1, permutation], method=Transformer.encode)
    assert np.abs(encoded_permuted - encoded[:, permutation]).max() > 1e-2


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_future_target_tokens_do_not_change_earlier_logits(norm_position):
    model, params = init(tiny(norm_position=norm_position))
    logits = model.apply({"params": params}, SRC, TGT_IN)
    for t in range(TGT_IN.shape[1] - 1):
        changed = TGT_IN.at[0, t + 1 :].set(99)
        changed_logits = model.apply({"params": params}, SRC, changed)
        np.testing.assert_allclose(changed_logits[0, : t + 1], logits[0, : t + 1], atol=1e-5)
        assert np.abs(changed_logits[0, t + 1 :] - logits[0, t + 1 :]).max() > 1e-4


def test_more_source_padding_changes_nothing():
    model, params = init(tiny())
    logits = model.apply({"params": params}, SRC, TGT_IN)
    longer = jnp.pad(SRC, ((0, 0), (0, 7)))  # pad_id = 0
    np.testing.assert_allclose(model.apply({"params": params}, longer, TGT_IN), logits, atol=1e-5)


def test_tokens_in_packed_padding_slots_change_nothing():
    model, params = init(tiny())
    segments = (SRC != 0).astype(jnp.int32)
    tgt_segments = (TGT_IN != 0).astype(jnp.int32)
    kwargs = dict(inputs_segmentation=segments, targets_segmentation=tgt_segments)
    logits = model.apply({"params": params}, SRC, TGT_IN, **kwargs)
    garbage = jnp.where(segments == 0, 77, SRC)  # not the pad id, but outside every segment
    changed = model.apply({"params": params}, garbage, TGT_IN, **kwargs)
    real = np.asarray(tgt_segments, bool)
    np.testing.assert_allclose(np.asarray(changed)[real], np.asarray(logits)[real], atol=1e-5)


def test_bfloat16_compute_gives_float32_logits_close_to_float32():
    model, params = init(tiny())
    logits = model.apply({"params": params}, SRC, TGT_IN)
    bf16_logits = Transformer(tiny(dtype="bfloat16")).apply({"params": params}, SRC, TGT_IN)
    assert bf16_logits.dtype == jnp.float32
    assert np.abs(bf16_logits - logits).max() < 0.1 * np.abs(logits).max()


def test_variants_have_the_expected_parameters():
    _, post = init(tiny())
    _, pre = init(tiny(norm_position="pre"))
    assert "final_norm" not in post["encoder"] and "final_norm" not in post["decoder"]
    assert "final_norm" in pre["encoder"] and "final_norm" in pre["decoder"]
    _, unshared = init(tiny(share_embeddings=False, attention_bias=True))
    assert {"source_embed", "target_embed", "output_projection"} <= set(unshared)
    assert "bias" in unshared["encoder"]["layer_0"]["self_attention"]["query"]
    assert "bias" not in post["encoder"]["layer_0"]["self_attention"]["query"]


def test_dropout_is_active_only_when_not_deterministic():
    model, params = init(tiny(dropout_rate=0.3))
    a = model.apply({"params": params}, SRC, TGT_IN, deterministic=False, rngs={"dropout": jax.random.key(1)})
    b = model.apply({"params": params}, SRC, TGT_IN, deterministic=False, rngs={"dropout": jax.random.key(2)})
    c = model.apply({"params": params}, SRC, TGT_IN)
    assert np.abs(a - b).max() > 1e-3
    # Deterministic means dropout off: the same logits as the model built with dropout_rate 0.
    no_dropout = Transformer(tiny(dropout_rate=0.0)).apply(
        {"params": params}, SRC, TGT_IN, deterministic=False, rngs={"dropout": jax.random.key(1)}
    )
    np.testing.assert_allclose(c, no_dropout, rtol=1e-6, atol=1e-6)


def test_inputs_longer_than_the_position_table_are_refused():
    """Without the check, positions past max_len read outside the table (garbage or NaN logits)."""
    from transformer_jax.decoding import beam_search, greedy_decode

    model, params = init(tiny(max_len=16))
    too_long = jnp.ones((1, 17), jnp.int32)
    fits = jnp.ones((1, 16), jnp.int32)
    with pytest.raises(ValueError, match="max_len=16"):
        model.apply({"params": params}, too_long, fits)
    with pytest.raises(ValueError, match="decoder_inputs has length 17"):
        model.apply({"params": params}, fits, too_long)
    with pytest.raises(ValueError, match="max_len=16"):
        model.apply({"params": params}, too_long, method="encode")
    for decode in (greedy_decode, beam_search):
        with pytest.raises(ValueError, match="max_len=16"):
            decode(model, params, too_long)
