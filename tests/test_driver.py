"""decoding/driver.py: decoding in segments (a growing cache, finished sentences leaving the batch) gives what
the whole search in one jit over a full-length cache gives, for greedy and beam search."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import config as config_lib
from transformer_jax.decoding import DecodeConfig, beam_search, beam_search_core, driver, greedy_decode, greedy_search
from transformer_jax.decoding.config import per_sentence_limits, resolve_max_decode_len
from transformer_jax.decoding.steps import encode, init_cache, transformer_step_fn
from transformer_jax.model import Transformer

CONFIG = config_lib.tiny(
    vocab_size=13, d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=2, max_len=40
)
DECODE = DecodeConfig(beam_size=3, alpha=0.6, extra_length=20, cache_segment=2)


def model_and_inputs(eos_boost: float):
    """A random model whose EOS logit leans on the last LayerNorm's bias by `eos_boost`, and 16 sources."""
    model = Transformer(CONFIG.replace(dropout_rate=0.0))
    rng = np.random.default_rng(0)
    inputs = np.zeros((16, 9), np.int32)  # [batch, src_len], pad 0
    for row, length in enumerate(rng.integers(1, 9, 16)):
        inputs[row, :length] = rng.integers(3, CONFIG.vocab_size, length)
        inputs[row, length] = CONFIG.eos_id
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), inputs[:, :2], inputs[:, :2])["params"])
    leaves, treedef = jax.tree.flatten(shapes)
    rng = np.random.default_rng(1)
    params = jax.tree.unflatten(treedef, [jnp.asarray(0.5 * rng.normal(size=x.shape), jnp.float32) for x in leaves])
    last_bias = params["decoder"]["layer_1"]["ffn_norm"]["bias"]
    params["embed"]["embedding"] = params["embed"]["embedding"].at[CONFIG.eos_id].add(eos_boost * last_bias)
    return model, params, inputs


@functools.partial(jax.jit, static_argnames=("model", "beam", "length"))
def one_jit(model, params, inputs, *, beam, length):
    """The oracle: the search in one lax.while_loop over a cache of the whole buffer, every sentence to the end."""
    cfg = model.config
    encoded = encode(model, params, inputs)
    rows = jnp.repeat(inputs, beam, axis=0) if beam > 1 else inputs
    cache = init_cache(model, params, encoded, rows, length, beam_size=beam)
    common = dict(
        max_decode_len=length,
        max_lengths=per_sentence_limits(inputs, cfg.pad_id, DECODE.extra_length, length),
        bos_id=cfg.bos_id,
        eos_id=cfg.eos_id,
        pad_id=cfg.pad_id,
    )
    step_fn = transformer_step_fn(model, params, encoded, rows)
    if beam == 1:
        return greedy_search(step_fn, cache, batch_size=inputs.shape[0], **common)
    return beam_search_core(step_fn, cache, batch_size=inputs.shape[0], beam_size=beam, alpha=DECODE.alpha, **common)


@pytest.fixture
def spied(monkeypatch):
    """Counts the batch compactions and cache growths; lets the batch shrink in steps of 2, down to 2 sentences."""
    calls = {"select": [], "resize": 0}
    select, resize = driver._select, driver._resize

    def counting_select(carry, keep):
        calls["select"].append(int(keep.shape[0]))
        return select(carry, keep)

    def counting_resize(carry, *, cache_len):
        calls["resize"] += 1
        return resize(carry, cache_len=cache_len)

    monkeypatch.setattr(driver, "MIN_ROWS", 2)
    monkeypatch.setattr(driver, "ROW_STEP", 2)
    monkeypatch.setattr(driver, "_select", counting_select)
    monkeypatch.setattr(driver, "_resize", counting_resize)
    return calls


@pytest.mark.parametrize("beam, eos_boost", [(1, 1.0), (3, 0.7)])  # boosts at which the batch shrinks
def test_segments_with_a_shrinking_batch_give_the_one_jit_outputs(spied, beam, eos_boost):
    model, params, inputs = model_and_inputs(eos_boost)
    length = resolve_max_decode_len(inputs.shape[1], DECODE, None, CONFIG.max_len)
    expected = jax.device_get(one_jit(model, params, jnp.asarray(inputs), beam=beam, length=length))
    if beam == 1:
        tokens, lengths, log_probs = greedy_decode(model, params, inputs, config=DECODE, return_log_probs=True)
        np.testing.assert_array_equal(tokens, expected[0])
        np.testing.assert_array_equal(lengths, expected[1])
        np.testing.assert_allclose(log_probs, expected[2], rtol=1e-5)
        assert lengths.min() <= 2 and lengths.max() > 16  # sentences end at different steps
    else:
        sequences, scores = beam_search(model, params, inputs, config=DECODE)
        np.testing.assert_array_equal(sequences, expected[0])
        np.testing.assert_allclose(scores, expected[1], rtol=1e-5)
    assert spied["select"] and spied["select"] == sorted(spied["select"], reverse=True)
    assert spied["select"][-1] < 16 and spied["resize"] >= 2


@pytest.mark.parametrize(
    "rows, active, shards, expected",
    [
        (100, 90, 1, 96),
        (100, 97, 1, 100),
        (100, 41, 1, 48),
        (48, 3, 1, 8),
        (48, 0, 1, 8),
        (8, 1, 1, 8),
        (64, 20, 16, 32),
    ],
)
def test_a_batch_shrinks_to_the_active_rows_rounded_up(rows, active, shards, expected):
    """ROW_STEP 8, MIN_ROWS 8: the next multiple of 8 (of 16 on a mesh of 16 batch shards, at least one), never
    grown."""
    assert (driver.ROW_STEP, driver.MIN_ROWS) == (8, 8)
    assert driver.shrunk_rows(rows, active, shards) == expected


def test_one_segment_is_the_plain_loop(spied):
    model, params, inputs = model_and_inputs(1.0)
    whole = DECODE.replace(cache_segment=0)
    tokens, _ = greedy_decode(model, params, inputs, config=whole)
    length = resolve_max_decode_len(inputs.shape[1], whole, None, CONFIG.max_len)
    np.testing.assert_array_equal(tokens, one_jit(model, params, jnp.asarray(inputs), beam=1, length=length)[0])
    assert spied == {"select": [], "resize": 0}


@pytest.mark.parametrize(
    "length, first, expected", [(66, 16, (16, 32, 64, 66)), (82, 16, (16, 32, 64, 82)), (10, 16, (10,)), (40, 0, (40,))]
)
def test_cache_lengths_double_up_to_the_buffer(length, first, expected):
    from transformer_jax.decoding.config import cache_lengths

    assert cache_lengths(length, first) == expected
