"""The Transformer and its layers as `flax.nnx` Modules: the Linen definitions behind `flax.nnx.bridge.ToNNX`.

The maths stays in model.py and layers/; each class here wraps one Linen module and is initialised when made:

    import transformer_jax.nnx as tnnx
    model = tnnx.Transformer(tiny(), rngs=nnx.Rngs(params=0, dropout=1))
    logits = model(src, tgt_in)                      # [batch, tgt_len, vocab]; deterministic=False: dropout
    model, tokenizer = tnnx.load("runs/demo")        # a trained workdir's checkpoint
    sequences, scores = beam_search(*tnnx.as_linen(model), src)     # decoding/ on the same parameters
    model = tnnx.sharded(lambda: tnnx.Transformer(cfg, rngs=nnx.Rngs(0)), mesh, sharding.FSDP_RULES)

Variables keep the Linen names, so `nnx.state(model, nnx.Param)` is the Linen `params` tree (`embed/embedding`,
`encoder/layer_0/self_attention/query/kernel`, ...), and each Param keeps its logical axis names ('vocab',
'embed', 'heads', 'kv', 'mlp') in its metadata, where `nnx.get_partition_spec` reads them. Dropout draws from the
module's own `rngs` ('dropout' stream), or from `rngs=` given to a call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx, traverse_util
from flax.nnx import bridge
from jax.sharding import Mesh

from transformer_jax import layers, model, sharding
from transformer_jax.config import ModelConfig
from transformer_jax.decoding.steps import as_params

M = TypeVar("M", bound=nnx.Module)

# flax >= 0.12 shards a Variable that has axis names as it is made, reading them as mesh axes (or by a rule table of
# its own, see `shardings`); ours are logical names placed by sharding.py's tables, so that is off while our
# modules are made. flax 0.11 has no eager sharding.
_eager_sharding = getattr(nnx, "use_eager_sharding", lambda _: contextlib.nullcontext())


def _tokens() -> jnp.ndarray:
    return jnp.ones((1, 1), jnp.int32)  # [batch, length] sample token ids (initialisation only)


def _features(config: ModelConfig) -> jnp.ndarray:
    return jnp.zeros((1, 1, config.d_model), config.dtype)  # [batch, length, d_model] sample activations


class _Bridged(bridge.ToNNX):
    """A Linen module behind bridge.ToNNX, its variables initialised from sample inputs when made."""

    def __init__(self, module: nn.Module, *sample_inputs: jnp.ndarray, rngs: nnx.Rngs):
        super().__init__(module, rngs=rngs)
        with _eager_sharding(False):
            bridge.lazy_init(self, *sample_inputs)


class MultiHeadAttention(_Bridged):
    """layers.MultiHeadAttention: `attn(x)` self-attention, `attn(x, memory, mask=...)` cross-attention."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(layers.MultiHeadAttention(config), _features(config), rngs=rngs)


class FeedForward(_Bridged):
    """layers.FeedForward: [batch, length, d_model] -> [batch, length, d_model]."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(layers.FeedForward(config), _features(config), rngs=rngs)


class TokenEmbedding(_Bridged):
    """layers.TokenEmbedding: ids [batch, length] -> [batch, length, d_model]; `.attend(x)` the output logits."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(layers.TokenEmbedding(config), _tokens(), rngs=rngs)


class PositionalEncoding(_Bridged):
    """layers.PositionalEncoding: positions [batch, length] -> [batch, length, d_model]."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(layers.PositionalEncoding(config), _tokens(), rngs=rngs)


class EncoderLayer(_Bridged):
    """model.EncoderLayer: `layer(x, mask, deterministic)`."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(model.EncoderLayer(config), _features(config), rngs=rngs)


class DecoderLayer(_Bridged):
    """model.DecoderLayer: `layer(x, memory, self_mask, cross_mask, deterministic)`."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(model.DecoderLayer(config), _features(config), _features(config), rngs=rngs)


class Encoder(_Bridged):
    """model.Encoder with its own token embedding (parameters under `embedding`): ids -> [batch, src_len, d_model]."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        linen = model.Encoder(config, embedding=layers.TokenEmbedding(config))
        super().__init__(linen, _tokens(), rngs=rngs)


class Decoder(_Bridged):
    """model.Decoder with its own token embedding: `decoder(ids, memory, self_mask, cross_mask)` -> features."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        linen = model.Decoder(config, embedding=layers.TokenEmbedding(config))
        super().__init__(linen, _tokens(), _features(config), rngs=rngs)


class Transformer(_Bridged):
    """model.Transformer: `model(inputs, decoder_inputs, ..., deterministic=True)` -> logits; `.encode`, `.decode`."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        super().__init__(model.Transformer(config), _tokens(), _tokens(), rngs=rngs)


def linen_module(bridged: bridge.ToNNX) -> nn.Module:
    """The Linen module a bridged model runs (flax 0.12 names the attribute `to_nnx__module`, 0.11 `module`)."""
    return getattr(bridged, "to_nnx__module", None) or bridged.module


def as_linen(bridged: bridge.ToNNX) -> tuple[nn.Module, Any]:
    """(Linen module, plain params) of a bridged model, for the Linen API: `beam_search(*as_linen(model), src)`,
    `greedy_decode`, `Translator(config, params, tokenizer)`, `interop.torch`. The params are the model's arrays."""
    return linen_module(bridged), nnx.to_pure_dict(nnx.state(bridged, nnx.Param))


def from_params(config: ModelConfig, params, *, rngs: nnx.Rngs | None = None) -> Transformer:
    """An NNX Transformer holding the Linen parameter tree `params` (a checkpoint's, boxed or plain); it is made
    with a random init whose values `params` then replace.

    rngs: the dropout stream for further training (default nnx.Rngs(0)). Raises ValueError naming the parameters
    that are missing or unexpected for `config`.
    """
    bridged = Transformer(config, rngs=nnx.Rngs(0) if rngs is None else rngs)
    state = nnx.state(bridged, nnx.Param)
    params = as_params(params)
    expected, given = set(traverse_util.flatten_dict(nnx.to_pure_dict(state))), set(traverse_util.flatten_dict(params))
    if expected != given:
        missing, unexpected = sorted(map("/".join, expected - given)), sorted(map("/".join, given - expected))
        raise ValueError(f"params do not fit the model config: missing {missing}, unexpected {unexpected}.")
    nnx.replace_by_pure_dict(state, params)
    nnx.update(bridged, state)
    return bridged


def load(workdir: str | Path, checkpoint: int | str | None = None) -> tuple[Transformer, Any]:
    """(NNX Transformer, tokenizer) of a trained workdir; checkpoint: None (latest), a step, 'averaged', 'imported'."""
    from transformer_jax.workdir import load_model_for_inference

    config, params, tokenizer = load_model_for_inference(workdir, checkpoint)
    return from_params(config, params), tokenizer


def shardings(bridged: nnx.Module, mesh: Mesh, rules: sharding.Rules = sharding.DEFAULT_RULES) -> nnx.State:
    """NamedShardings of the module's state (an nnx.State of the same structure), from the logical axis names in
    its variables' metadata by one of sharding.py's rule tables; variables without names are replicated.

    The rules are applied as the Linen model's are (`nn.logical_to_mesh_sharding`: a name takes its first rule
    whose mesh axes the array does not use yet). `nnx.get_partition_spec` under `nn.logical_axis_rules` would keep
    only the last rule of each name and lose the tables' fallbacks (FSDP's 'mlp' -> 'fsdp' for vectors).
    """
    return nn.logical_to_mesh_sharding(nnx.get_partition_spec(nnx.state(bridged)), mesh, rules)


def sharded(create: Callable[[], M], mesh: Mesh, rules: sharding.Rules = sharding.DEFAULT_RULES) -> M:
    """`create()` (e.g. `lambda: Transformer(config, rngs=nnx.Rngs(0))`) jitted so that every variable is made in
    its sharding over `mesh` by `rules`: no device holds the whole model on the way. For a model made already
    (`load`), `nnx.update(model, jax.device_put(nnx.state(model), shardings(model, mesh, rules)))`."""

    @nnx.jit
    def make() -> M:
        made = create()
        state = nnx.state(made)
        nnx.update(made, jax.lax.with_sharding_constraint(state, shardings(made, mesh, rules)))
        return made

    return make()
