"""The decode cache and greedy decoding, checked against teacher-forced forward passes and hand-made models."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import config as config_lib
from transformer_jax.decoding import (
    DecodeConfig,
    gather_beams,
    greedy_decode,
    greedy_search,
    init_cache,
    reorder_cache,
    transformer_step_fn,
)
from transformer_jax.decoding.config import per_sentence_limits, resolve_max_decode_len
from transformer_jax.model import Transformer

PAD, BOS, EOS = 0, 1, 2
TINY = config_lib.tiny(
    vocab_size=11,
    d_model=16,
    num_heads=2,
    d_ff=32,
    num_encoder_layers=1,
    num_decoder_layers=2,
    max_len=16,
    dropout_rate=0.0,
)
# Queries/keys of d_k = 3 and values of d_v = 5 per head, both unlike d_model / num_heads = 8 (§3.2.2).
UNEVEN = TINY.replace(key_dim=3, value_dim=5)
SOURCES = jnp.array([[5, 6, 3, 4, 9, 7, 2], [4, 3, 8, 2, 0, 0, 0]], jnp.int32)  # [batch=2, src_len=7]


def random_params(model, seed=0, scale=0.6):
    """Random parameters without compiling model.init (only its shapes are traced)."""
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), SOURCES, SOURCES)["params"])
    leaves, treedef = jax.tree.flatten(shapes)
    rng = np.random.default_rng(seed)
    return jax.tree.unflatten(
        treedef, [jnp.asarray(scale * rng.normal(size=leaf.shape), jnp.float32) for leaf in leaves]
    )


@pytest.fixture(scope="module", params=[TINY, UNEVEN], ids=["dk=dv", "dk!=dv"])
def tiny(request):
    model = Transformer(request.param)
    return model, random_params(model, seed=1, scale=1.0)


@pytest.fixture(scope="module")
def compiled(tiny):
    """Jitted pieces shared by the tests (few shapes, so few compilations on a small CPU)."""
    model, params = tiny
    encoded = model.apply({"params": params}, SOURCES, method="encode")  # [batch=2, src_len=7, d_model]

    @jax.jit
    def step(tokens, cache):
        return transformer_step_fn(model, params, encoded, SOURCES)(tokens, cache)

    cache = jax.jit(lambda e: init_cache(model, params, e, SOURCES, 6))(encoded)  # 6 steps
    forward = jax.jit(lambda decoder_inputs: model.apply({"params": params}, SOURCES, decoder_inputs))
    return {"encoded": encoded, "cache": cache, "step": step, "forward": forward}


# ------------------------------------------------------------------------------------------------ cache
def test_cached_steps_match_teacher_forced_logits(tiny, compiled):
    cfg = tiny[0].config
    targets = jnp.array([[3, 7, 5, 9, 4, 6], [8, 8, 3, 10, 5, 2]], jnp.int32)  # [batch, 6], no pad
    decoder_inputs = jnp.concatenate([jnp.full((2, 1), BOS), targets[:, :-1]], axis=1)  # shifted right
    expected = compiled["forward"](decoder_inputs)  # [batch, 6, vocab], one teacher-forced pass
    cache = compiled["cache"]
    for t in range(6):
        logits, cache = compiled["step"](decoder_inputs[:, t], cache)  # [batch, vocab]
        assert logits.dtype == jnp.float32
        np.testing.assert_allclose(logits, expected[:, t], rtol=1e-5, atol=1e-5, err_msg=f"step {t}")
    for index in range(cfg.num_decoder_layers):  # one self-attention cache per layer, filled to the end
        layer = cache["decoder"][f"layer_{index}"]["self_attention"]["keys_values"]
        assert layer.key.shape == (2, cfg.num_heads, 6, cfg.d_k)  # [batch, heads, length, d_k]
        assert layer.value.shape == (2, cfg.num_heads, 6, cfg.d_v)
        assert int(layer.index) == 6


def _dot_operand_shapes(jaxpr):
    """Operand shapes of every dot_general in a jaxpr, nested calls included."""
    shapes = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            shapes.append([tuple(v.aval.shape) for v in eqn.invars])
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    shapes.extend(_dot_operand_shapes(inner))
    return shapes


def test_cross_attention_keys_values_are_computed_once_per_source(tiny, compiled):
    model, params = tiny
    cfg = model.config
    encoded, cache = compiled["encoded"], compiled["cache"]  # encoded: [batch, src_len=7, d_model]
    for index in range(cfg.num_decoder_layers):
        layer_params = params["decoder"][f"layer_{index}"]["cross_attention"]
        memory = cache["decoder"][f"layer_{index}"]["cross_attention"]["memory"]
        for name in ("key", "value"):
            projected = jnp.einsum("bsd,dhk->bhsk", encoded, layer_params[name]["kernel"])  # heads-major
            np.testing.assert_allclose(getattr(memory, name), projected, rtol=1e-5, atol=1e-5)

    # A K/V projection of the memory is a dot with a [batch * src_len, d_model] operand (the tokens flattened):
    # no step repeats one.
    memory_tokens = SOURCES.shape[0] * SOURCES.shape[1]
    step_dots = _dot_operand_shapes(jax.make_jaxpr(compiled["step"])(jnp.full((2,), BOS), cache).jaxpr)
    assert step_dots and not any(
        len(shape) >= 2 and shape[-1] == cfg.d_model and int(np.prod(shape[:-1])) == memory_tokens
        for operands in step_dots
        for shape in operands
    )

    # A beam cache (2 hypotheses per source) does the K/V projections once per source and nothing else: under jit
    # the dummy decoder pass that sizes the cache is dead code. Per hypothesis it would be twice the work; the dummy
    # pass alive, about 8 times.
    rows = jnp.repeat(SOURCES, 2, axis=0)  # [batch * beam, src_len]
    init = jax.jit(lambda e: init_cache(model, params, e, rows, 6, beam_size=2)).lower(encoded).compile()
    cost = init.cost_analysis()
    flops = (cost[0] if isinstance(cost, list) else cost)["flops"]  # a list in older jax
    # K and V of each layer: [tokens, d] @ [d, h * d_k] and [tokens, d] @ [d, h * d_v]
    projection_flops = 2 * memory_tokens * cfg.d_model * cfg.num_heads * (cfg.d_k + cfg.d_v)
    assert flops == pytest.approx(cfg.num_decoder_layers * projection_flops, rel=0.1)

    _, stepped = compiled["step"](jnp.full((2,), BOS), cache)
    for name in ("key", "value"):
        np.testing.assert_array_equal(
            getattr(stepped["decoder"]["layer_1"]["cross_attention"]["memory"], name),
            getattr(cache["decoder"]["layer_1"]["cross_attention"]["memory"], name),
        )


@pytest.mark.parametrize("beam_size", [1, 2])
def test_reordered_cache_continues_each_parents_prefix(tiny, beam_size):
    """One source, 2 hypotheses. With block 1 each row owns its keys and reordering copies them; with block 2
    (beam search) the keys stay where they were computed and the lineage moves. Either way, after a reorder each
    hypothesis's next logits are those of a teacher-forced pass over its parent's prefix (the oracle has no cache).
    """
    model, params = tiny
    source = SOURCES[:1]
    rows = jnp.repeat(source, 2, axis=0)  # [hypotheses=2, src_len]
    encoded = model.apply({"params": params}, source, method="encode")  # [1, src_len, d_model], shared
    step = jax.jit(transformer_step_fn(model, params, encoded, rows))
    cache = init_cache(model, params, encoded, rows, 6, beam_size=beam_size)
    _, cache = step(jnp.full((2,), BOS), cache)
    _, cache = step(jnp.array([3, 4]), cache)  # prefixes: row 0 BOS 3, row 1 BOS 4
    for parents in ([1, 1], [1, 0]):
        for one_hot in (False, True):
            moved = reorder_cache(cache, jnp.array([parents]), one_hot=one_hot)  # [batch=1, beam=2]
            logits, _ = step(jnp.array([5, 6]), moved)  # [2, vocab]
            decoder_inputs = jnp.array([[BOS, 3 + parent, token] for parent, token in zip(parents, (5, 6))])
            expected = model.apply({"params": params}, rows, decoder_inputs)[:, 2]  # [2, vocab]
            np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5, err_msg=f"{parents} {one_hot}")
            for index in range(model.config.num_decoder_layers):
                before, after = cache["decoder"][f"layer_{index}"], moved["decoder"][f"layer_{index}"]
                keys = after["self_attention"]["keys_values"].key
                kept = before["self_attention"]["keys_values"].key
                np.testing.assert_array_equal(keys, kept if beam_size > 1 else kept[jnp.array(parents)])
                assert int(after["self_attention"]["keys_values"].index) == 2
                np.testing.assert_array_equal(
                    after["cross_attention"]["memory"].value, before["cross_attention"]["memory"].value
                )


def test_gather_beams_takes_rows_within_each_sentence():
    x = jnp.arange(2 * 3 * 4, dtype=jnp.float32).reshape(2, 3, 4) * 1.37  # [batch, beam, ...]
    indices = jnp.array([[2, 2, 0], [1, 0, 1]])
    expected = np.stack([np.asarray(x)[0, [2, 2, 0]], np.asarray(x)[1, [1, 0, 1]]])
    np.testing.assert_array_equal(gather_beams(x, indices), expected)
    np.testing.assert_array_equal(gather_beams(x, indices, one_hot=True), gather_beams(x, indices))


# Runs on 4 simulated CPU devices (the count is fixed before JAX starts, hence a subprocess); prints JSON.
SHARDED_BEAM_CACHE = textwrap.dedent(
    """
    import json, sys

    import jax, jax.numpy as jnp, numpy as np

    sys.path.insert(0, sys.argv[1])
    from test_decoding import SOURCES, TINY, random_params
    from transformer_jax import sharding
    from transformer_jax.decoding import beam_search, constrain_cache, init_cache
    from transformer_jax.model import Transformer

    model = Transformer(TINY)
    params = random_params(model, seed=1, scale=1.0)
    mesh = sharding.make_mesh({"data": 2, "tensor": 2})
    rules = sharding.rules_for_mesh(mesh)

    @jax.jit
    def beam_cache(params):  # 2 sources x beam 2, pinned to the mesh
        encoded = model.apply({"params": params}, SOURCES, method="encode")
        cache = init_cache(model, params, encoded, jnp.repeat(SOURCES, 2, axis=0), 6, beam_size=2)
        return constrain_cache(cache, mesh, rules)

    cache = beam_cache(params)
    layer = cache["decoder"]["layer_0"]
    arrays = {
        "key": layer["self_attention"]["keys_values"].key,
        "lineage": cache["decoder"]["lineage"].rows,
        "index": layer["self_attention"]["keys_values"].index,
        "memory_value": layer["cross_attention"]["memory"].value,
        "position": cache["decoder"]["lineage"].index,
    }
    out = {name: [list(a.shape), list(a.addressable_shards[0].data.shape)] for name, a in arrays.items()}
    sharded = beam_search(model, params, SOURCES, beam_size=2, max_decode_len=6, mesh=mesh, rules=rules)
    alone = beam_search(model, params, SOURCES, beam_size=2, max_decode_len=6)
    out["same_sequences"] = bool(np.array_equal(sharded[0], alone[0]))
    out["score_difference"] = float(np.max(np.abs(np.asarray(sharded[1]) - np.asarray(alone[1]))))
    print(json.dumps(out))
    """
)


def test_beam_cache_is_split_by_source_and_head_on_a_mesh():
    """On a data 2 x tensor 2 mesh the beam cache splits along its sources (a source's hypotheses, lineage and
    memory on one device, so reordering is local) and along the heads (like the Q/K/V projections); the step
    counters are replicated; beam search with the cache pinned there gives the one-device n-best."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu")
    command = [sys.executable, "-c", SHARDED_BEAM_CACHE, str(Path(__file__).parent)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    heads, head_dim = TINY.num_heads, TINY.head_dim
    assert out["key"] == [[2, heads, 6 * 2, head_dim], [1, heads // 2, 6 * 2, head_dim]]  # [sources, heads, ...]
    assert out["lineage"] == [[2, 2, 6], [1, 2, 6]]  # [sources, beam, length]: a source's beam on one device
    assert out["memory_value"] == [[2, heads, 7, head_dim], [1, heads // 2, 7, head_dim]]
    assert out["index"] == out["position"] == [[], []]
    assert out["same_sequences"] and out["score_difference"] <= 1e-5


# ----------------------------------------------------------------------------------------------- greedy
def test_greedy_matches_teacher_forcing_batch_equals_alone_and_eos_ends_rows(tiny, compiled):
    model, params = tiny
    tokens, lengths = greedy_decode(model, params, SOURCES, max_decode_len=6)
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    assert tokens.shape == (2, 6) and lengths.tolist() == [6, 6]  # this random model never says EOS
    # Every token is the argmax (pad excluded) of a teacher-forced pass over the tokens before it.
    logits = np.array(compiled["forward"](jnp.concatenate([jnp.full((2, 1), BOS), tokens[:, :-1]], axis=1)))
    logits[:, :, PAD] = -np.inf
    np.testing.assert_array_equal(np.argmax(logits, axis=-1), tokens)

    alone, alone_lengths = greedy_decode(model, params, SOURCES[1:, :4], max_decode_len=6)  # unpadded
    np.testing.assert_array_equal(np.asarray(alone)[0], tokens[1])
    assert int(alone_lengths[0]) == lengths[1]

    # Relabel sentence 1's first token as EOS (same parameters): it now ends at once, length 1, pad after;
    # sentence 0 stops at its first occurrence of that token, if any.
    first = int(tokens[1, 0])
    assert first not in (PAD, BOS), "pick parameters whose greedy output starts with an ordinary token"
    relabelled, relabelled_lengths = greedy_decode(
        Transformer(model.config.replace(eos_id=first)), params, SOURCES, max_decode_len=6
    )
    assert np.asarray(relabelled)[1].tolist() == [first] + [PAD] * 5
    row = tokens[0].tolist()
    cut = row.index(first) + 1 if first in row else len(row)
    assert np.asarray(relabelled)[0].tolist() == row[:cut] + [PAD] * (6 - cut)
    assert np.asarray(relabelled_lengths).tolist() == [cut, 1]


def script_step(tokens, cache, probabilities):
    """A model that ignores the prefix: row r at step t draws from probabilities[r, t]."""
    logits = jnp.log(probabilities[cache["row"], cache["step"]])  # [n, vocab]
    return logits, {"row": cache["row"], "step": cache["step"] + 1}


def test_greedy_eos_first_has_length_one_pad_after_eos_and_limits_per_sentence():
    probabilities = np.full((4, 5, 6), 0.02, np.float32)
    probabilities[0, 0, EOS] = 0.9  # EOS first
    probabilities[1, [0, 1, 2], [3, 4, EOS]] = 0.9  # 3 4 EOS
    probabilities[2, :, 5] = 0.9  # never EOS: cut at the buffer end
    probabilities[3, :, 5] = 0.9  # never EOS: cut at its own limit, 2
    probabilities[:, :, PAD] = 0.95  # pad is never emitted, however likely
    cache = {"row": jnp.arange(4), "step": jnp.array(0)}
    tokens, lengths, log_probs = greedy_search(
        lambda t, c: script_step(t, c, jnp.asarray(probabilities)),
        cache,
        batch_size=4,
        max_decode_len=5,
        max_lengths=jnp.array([5, 5, 5, 2]),
        bos_id=BOS,
        eos_id=EOS,
        pad_id=PAD,
    )
    assert tokens.tolist() == [[EOS, PAD, PAD, PAD, PAD], [3, 4, EOS, PAD, PAD], [5, 5, 5, 5, 5], [5, 5, PAD, PAD, PAD]]
    assert lengths.tolist() == [1, 3, 5, 2]
    normaliser = np.log(probabilities[0, 0].sum())
    np.testing.assert_allclose(log_probs[0], np.log(0.9) - normaliser, rtol=1e-5)


def test_default_length_limit_is_source_length_plus_50():
    assert resolve_max_decode_len(7, DecodeConfig(), None, model_max_len=512) == 57  # §6.1
    assert resolve_max_decode_len(7, DecodeConfig(), None, model_max_len=16) == 16  # clipped to positions
    assert resolve_max_decode_len(7, DecodeConfig(extra_length=3), 9, model_max_len=16) == 9
    with pytest.raises(ValueError, match="max_len"):
        resolve_max_decode_len(7, DecodeConfig(), 17, model_max_len=16)
    limits = per_sentence_limits(SOURCES, PAD, extra_length=2, max_decode_len=8)
    assert limits.tolist() == [8, 6]  # 7 + 2 clipped to 8; 4 + 2
