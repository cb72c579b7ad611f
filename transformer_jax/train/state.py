"""TrainState: everything a training step reads and writes, as a plain pytree (checkpointed as a whole).

The model and the optax transformation are not in the state (they are static and rebuilt from the config);
`create_train_state` returns the state already placed on the mesh, with the NamedShardings derived from the
parameters' logical axis names (sharding.py).
"""

from __future__ import annotations

import functools
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from transformer_jax import sharding
from transformer_jax.config import ModelConfig
from transformer_jax.model import Transformer


class TrainState(flax.struct.PyTreeNode):
    """step: train_step calls done (micro-steps); the optimizer has done step // accum_steps updates.

    rng: base key (uint32[2]); the dropout key of a step is fold_in(rng, step), so a resumed run draws the
    same masks as an uninterrupted one. grad_accum / accum_tokens: token-weighted gradient sum and target-token
    count of the micro-batches since the last update (None / 0 when accum_steps == 1).
    """

    step: jnp.ndarray
    params: Any
    opt_state: Any
    rng: jnp.ndarray
    grad_accum: Any = None
    accum_tokens: jnp.ndarray | None = None


def _boxed_params(model: Transformer, rng: jax.Array) -> Any:
    """The model's parameters, still in their `nn.LogicallyPartitioned` boxes."""
    tokens = jnp.ones((1, 8), jnp.int32)  # [batch, length]: the parameter shapes do not depend on it
    return model.init({"params": rng}, tokens, tokens)["params"]


def boxed_init_fn(model: Transformer, tx: optax.GradientTransformation, accum_steps: int):
    """rng -> TrainState with parameters still in their `nn.LogicallyPartitioned` boxes."""

    def init(rng):
        params_rng, dropout_rng = jax.random.split(rng)
        params = _boxed_params(model, params_rng)
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=tx.init(params),  # Adam moments inherit the parameters' boxes (and shardings)
            rng=dropout_rng,
            grad_accum=jax.tree.map(jnp.zeros_like, params) if accum_steps > 1 else None,
            accum_tokens=jnp.zeros((), jnp.float32) if accum_steps > 1 else None,
        )

    return init


def state_initializer(
    model_cfg: ModelConfig,
    tx: optax.GradientTransformation,
    mesh: Mesh,
    rules: sharding.Rules = sharding.DEFAULT_RULES,
    accum_steps: int = 1,
    compiler_options: dict | None = None,
):
    """(init, state_shardings, abstract_state): `init(rng)` is jitted and returns the state on the mesh.

    The shardings are derived from the parameters' logical axis names; abstract_state is a tree of
    jax.ShapeDtypeStruct with those shardings (the target of a checkpoint restore). Nothing is computed here.
    """
    boxed_init = boxed_init_fn(Transformer(model_cfg), tx, accum_steps)
    abstract_boxed = jax.eval_shape(boxed_init, jax.random.PRNGKey(0))
    shardings = sharding.tree_shardings(abstract_boxed, mesh, rules)
    init = jax.jit(lambda key: nn.unbox(boxed_init(key)), out_shardings=shardings, compiler_options=compiler_options)
    abstract = jax.tree.map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        nn.unbox(abstract_boxed),
        shardings,
    )
    return init, shardings, abstract


def params_shardings(model_cfg: ModelConfig, mesh: Mesh, rules: sharding.Rules = sharding.DEFAULT_RULES) -> Any:
    """The NamedShardings of the parameters alone, those of `state_initializer`'s state.params, without the
    optimizer (for a trained model's parameters, e.g. a checkpoint scored apart from its run). Nothing is computed."""
    boxed = jax.eval_shape(functools.partial(_boxed_params, Transformer(model_cfg)), jax.random.PRNGKey(0))
    return sharding.tree_shardings(boxed, mesh, rules)


def create_train_state(
    model_cfg: ModelConfig,
    tx: optax.GradientTransformation,
    seed: int,
    mesh: Mesh,
    rules: sharding.Rules = sharding.DEFAULT_RULES,
    accum_steps: int = 1,
):
    """Initialises the state on the mesh. Returns (state, state_shardings, abstract_state)."""
    init, shardings, abstract = state_initializer(model_cfg, tx, mesh, rules, accum_steps)
    return init(jax.random.PRNGKey(seed)), shardings, abstract
