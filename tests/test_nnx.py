"""transformer_jax.nnx against its oracle, the Linen model: parameters, forward passes, training inside a user's
nnx.Module, a trained workdir's translations, shardings on 8 simulated devices, and the README's NNX snippet."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import tiny_run_overrides
from flax import nnx, traverse_util

import transformer_jax
import transformer_jax.nnx as tnnx
from transformer_jax import layers, model
from transformer_jax.config import ModelConfig, tiny
from transformer_jax.decoding import beam_search, greedy_decode
from transformer_jax.experiment import load_experiment
from transformer_jax.train import loop
from transformer_jax.workdir import load_params

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["three small red cats", "the 3rd of May 2021", "I think that the dog sees the cat"]
DROPOUT = dict(dropout_rate=0.1, attention_dropout_rate=0.1, relu_dropout_rate=0.1)
CONFIGS = {
    "post": tiny(vocab_size=64, max_len=16, **DROPOUT),
    "pre": tiny(vocab_size=64, max_len=16, norm_position="pre", **DROPOUT),
    "pre_unshared_learned_bias": tiny(
        vocab_size=64,
        max_len=16,
        norm_position="pre",
        share_embeddings=False,
        position_encoding="learned",
        attention_bias=True,
        **DROPOUT,
    ),
}
SRC = jnp.array([[5, 9, 12, 7, 2, 0, 0], [8, 3, 2, 0, 0, 0, 0]])  # [batch, src_len], padded
TGT_IN = jnp.array([[1, 40, 41, 42, 0], [1, 17, 0, 0, 0]])  # [batch, tgt_len], padded


def assert_trees_equal(got, want):
    got, want = traverse_util.flatten_dict(got), traverse_util.flatten_dict(nn.unbox(want))
    assert got.keys() == want.keys()
    for path in want:
        np.testing.assert_array_equal(got[path], want[path], err_msg="/".join(path))


# ---------------------------------------------------------------------------------------------- the model


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_parameters_have_the_linen_names_shapes_and_logical_axes(name):
    cfg = CONFIGS[name]
    bridged = tnnx.Transformer(cfg, rngs=nnx.Rngs(params=0))
    boxed = model.Transformer(cfg).init(jax.random.key(0), SRC[:1, :1], TGT_IN[:1, :1])["params"]
    shape = jax.tree.map(lambda x: (x.shape, x.dtype), tnnx.as_linen(bridged)[1])
    assert traverse_util.flatten_dict(shape) == traverse_util.flatten_dict(
        jax.tree.map(lambda x: (x.shape, x.dtype), nn.unbox(boxed))
    )
    logical = nnx.to_pure_dict(nnx.get_partition_spec(nnx.state(bridged, nnx.Param)))
    assert traverse_util.flatten_dict(logical) == traverse_util.flatten_dict(nn.get_partition_spec(boxed))
    assert logical["encoder"]["layer_0"]["self_attention"]["query"]["kernel"] == jax.sharding.PartitionSpec(
        "embed", "heads", "kv"
    )


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_forward_equals_linen_in_eval_and_train_mode(name):
    cfg = CONFIGS[name]
    linen = model.Transformer(cfg)
    params = nn.unbox(linen.init(jax.random.key(1), SRC, TGT_IN)["params"])
    bridged = tnnx.from_params(cfg, params)
    assert_trees_equal(tnnx.as_linen(bridged)[1], params)
    evaluated = bridged(SRC, TGT_IN)
    np.testing.assert_array_equal(evaluated, linen.apply({"params": params}, SRC, TGT_IN))
    # Dropout: a call's rngs=nnx.Rngs(dropout=k) gives the Linen model the key its 'dropout' stream draws.
    trained = bridged(SRC, TGT_IN, deterministic=False, rngs=nnx.Rngs(dropout=7))
    key = nnx.Rngs(dropout=7).dropout()
    reference = linen.apply({"params": params}, SRC, TGT_IN, deterministic=False, rngs={"dropout": key})
    np.testing.assert_array_equal(trained, reference)
    assert np.max(np.abs(np.asarray(trained) - np.asarray(evaluated))) > 1e-2  # dropout was on
    encoded = bridged.encode(SRC)
    np.testing.assert_array_equal(encoded, linen.apply({"params": params}, SRC, method="encode"))


def test_from_params_names_what_does_not_fit():
    cfg = CONFIGS["post"]
    params = tnnx.as_linen(tnnx.Transformer(cfg, rngs=nnx.Rngs(0)))[1]
    with pytest.raises(ValueError, match=r"missing \[.*'encoder/final_norm/scale'\], unexpected \[\]"):
        tnnx.from_params(cfg.replace(norm_position="pre"), params)


# ---------------------------------------------------------------------------------------------- the layers


def features(shape, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


LAYER_CALLS = {  # NNX class, its Linen module, the call's arguments
    "MultiHeadAttention": (
        tnnx.MultiHeadAttention,
        layers.MultiHeadAttention,
        lambda cfg: (features((2, 5, cfg.d_model)), features((2, 7, cfg.d_model), 1), (SRC != 0)[:, None, None, :]),
    ),
    "FeedForward": (tnnx.FeedForward, layers.FeedForward, lambda cfg: (features((2, 5, cfg.d_model)),)),
    "TokenEmbedding": (tnnx.TokenEmbedding, layers.TokenEmbedding, lambda cfg: (SRC,)),
    "EncoderLayer": (
        tnnx.EncoderLayer,
        model.EncoderLayer,
        lambda cfg: (features((2, 7, cfg.d_model)), (SRC != 0)[:, None, None, :]),
    ),
    "DecoderLayer": (
        tnnx.DecoderLayer,
        model.DecoderLayer,
        lambda cfg: (features((2, 5, cfg.d_model)), features((2, 7, cfg.d_model), 1), layers.causal_mask(5)),
    ),
}


@pytest.mark.parametrize("name", sorted(LAYER_CALLS))
def test_layers_equal_linen(name):
    nnx_class, linen_class, arguments = LAYER_CALLS[name]
    cfg = CONFIGS["pre_unshared_learned_bias"]
    bridged = nnx_class(cfg, rngs=nnx.Rngs(params=3))
    linen = linen_class(cfg)
    inputs = arguments(cfg)
    boxed = linen.init(jax.random.key(3), *inputs)["params"]
    _, params = tnnx.as_linen(bridged)
    assert jax.tree.structure(params) == jax.tree.structure(nn.unbox(boxed))
    np.testing.assert_array_equal(bridged(*inputs), linen.apply({"params": params}, *inputs))


def test_encoder_and_decoder_stacks_equal_linen():
    cfg = CONFIGS["pre"]
    encoder, decoder = tnnx.Encoder(cfg, rngs=nnx.Rngs(0)), tnnx.Decoder(cfg, rngs=nnx.Rngs(1))
    mask = (SRC != 0)[:, None, None, :]
    memory = encoder(SRC, mask)
    linen_encoder = model.Encoder(cfg, embedding=layers.TokenEmbedding(cfg))
    np.testing.assert_array_equal(memory, linen_encoder.apply({"params": tnnx.as_linen(encoder)[1]}, SRC, mask))
    assert set(tnnx.as_linen(encoder)[1]) == {"embedding", "layer_0", "layer_1", "final_norm"}
    linen_decoder = model.Decoder(cfg, embedding=layers.TokenEmbedding(cfg))
    out = decoder(TGT_IN, memory, layers.causal_mask(5), mask)
    reference = linen_decoder.apply({"params": tnnx.as_linen(decoder)[1]}, TGT_IN, memory, layers.causal_mask(5), mask)
    np.testing.assert_array_equal(out, reference)


# ---------------------------------------------------------------------------------------------- in a user's model


class SetClassifier(nnx.Module):
    """Attention-pooled classifier over a set of vectors, in NNX: our attention and FFN, the user's own head."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        self.attention = tnnx.MultiHeadAttention(config, rngs=rngs)
        self.ffn = tnnx.FeedForward(config, rngs=rngs)
        self.head = nnx.Linear(config.d_model, 2, rngs=rngs)

    def __call__(self, x):  # x: [batch, items, d_model]
        x = x + self.attention(x)
        x = x + self.ffn(x)
        return self.head(x.mean(axis=1))  # [batch, 2]


@pytest.mark.rounding
def test_layers_train_inside_a_users_nnx_module():
    cfg = ModelConfig(vocab_size=8, d_model=16, num_heads=2, d_ff=32, dropout_rate=0.0)
    classifier = SetClassifier(cfg, nnx.Rngs(0))
    optimizer = nnx.Optimizer(classifier, optax.adam(1e-2), wrt=nnx.Param)
    x = features((32, 5, 16))
    labels = (x[:, :, 0].sum(1) > 0).astype(jnp.int32)
    before = nnx.to_pure_dict(nnx.clone(nnx.state(classifier, nnx.Param)))

    def loss_fn(classifier):
        return optax.softmax_cross_entropy_with_integer_labels(classifier(x), labels).mean()

    @nnx.jit
    def step(classifier, optimizer):
        loss, grads = nnx.value_and_grad(loss_fn)(classifier)
        optimizer.update(classifier, grads)
        return loss

    first = loss_fn(classifier)
    for _ in range(30):
        loss = step(classifier, optimizer)
    assert loss < 0.5 * first
    after = traverse_util.flatten_dict(nnx.to_pure_dict(nnx.state(classifier, nnx.Param)))
    assert {path[0] for path in after} == {"attention", "ffn", "head"}
    for path, value in traverse_util.flatten_dict(before).items():  # every parameter of ours was trained
        assert np.max(np.abs(np.asarray(after[path]) - np.asarray(value))) > 1e-3, "/".join(path)


# ---------------------------------------------------------------------------------------------- a trained workdir


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("trained")
    loop.train(load_experiment("experiments/tiny.py", tiny_run_overrides(steps=9)), directory)
    return directory


def translate(bridged, tokenizer, method: str) -> list[str]:
    """Each source alone through decoding/ on the NNX model's parameters."""
    out = []
    for source in SOURCES:
        inputs = np.array([tokenizer.encode(source) + [tokenizer.eos_id]], np.int32)  # [1, src_len]
        if method == "greedy":
            tokens = np.asarray(greedy_decode(*tnnx.as_linen(bridged), inputs)[0])[0]
        else:
            tokens = np.asarray(beam_search(*tnnx.as_linen(bridged), inputs)[0])[0, 0]
        out.append(tokenizer.decode(tokens.tolist()))
    return out


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_a_checkpoint_becomes_an_nnx_model_that_translates_like_translator(workdir, method):
    bridged, tokenizer = tnnx.load(workdir)
    assert_trees_equal(tnnx.as_linen(bridged)[1], load_params(workdir))
    translator = transformer_jax.load(workdir, method=method, batch_size=1)
    inputs = np.array([tokenizer.encode(SOURCES[2]) + [tokenizer.eos_id]], np.int32)
    np.testing.assert_array_equal(
        bridged(inputs, inputs), translator.model.apply({"params": translator.params}, inputs, inputs)
    )
    translations = translate(bridged, tokenizer, method)
    assert translations == translator.translate(SOURCES)
    untrained = tnnx.Transformer(translator.model_config, rngs=nnx.Rngs(0))
    assert translate(untrained, tokenizer, method) != translations  # the comparison depends on the parameters


# ---------------------------------------------------------------------------------------------- sharding


@pytest.fixture(scope="module")
def sharded_layouts():
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    command = [sys.executable, str(Path(__file__).parent / "helpers" / "nnx_sharding.py")]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, f"{' '.join(command)} failed:\n{proc.stderr[-4000:]}"
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["device_count"] == 8
    return data["layouts"]


def test_nnx_model_is_sharded_like_the_linen_one(sharded_layouts):
    assert set(sharded_layouts) == {"data8", "fsdp4_data2", "tensor2_data4", "fsdp2_tensor2_data2"}
    for name, layout in sharded_layouts.items():
        assert layout["nnx"] == layout["linen"], name
        assert layout["max_logit_diff"] < 1e-5, name
    sharded = {name: sum(any(axes) for axes in layout["nnx"].values()) for name, layout in sharded_layouts.items()}
    assert sharded.pop("data8") == 0 and min(sharded.values()) > 10  # data parallel replicates every parameter
    # the tables' fallback rules hold: FSDP splits the FFN's first bias ['mlp'] over 'fsdp', tensor over 'tensor'
    bias = "encoder/layer_0/ffn/wi/bias"
    assert sharded_layouts["fsdp4_data2"]["nnx"][bias] == ["fsdp"]
    assert sharded_layouts["fsdp2_tensor2_data2"]["nnx"][bias] == ["tensor"]
    assert sharded_layouts["tensor2_data4"]["nnx"]["source_embed/embedding"] == ["tensor", None]


# ---------------------------------------------------------------------------------------------- the README


def test_readme_nnx_snippet_runs(workdir):
    """The README's NNX snippet, on this module's trained workdir instead of runs/demo."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    (snippet,) = [block for block in blocks if "import transformer_jax.nnx" in block]
    namespace: dict = {}
    exec(compile(snippet.replace('"runs/demo"', repr(str(workdir))), "README.md", "exec"), namespace)
    assert isinstance(namespace["model"], tnnx.Transformer)
    assert np.isfinite(float(namespace["loss"]))
