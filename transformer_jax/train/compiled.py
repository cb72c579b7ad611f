"""The compiled functions of a run: state init, the train step of its parallel mode (config `mesh.mode`), the
eval step, and the abstract state a checkpoint is restored into (`compiled_steps`); the eval step alone, for trained
parameters scored apart from their run (`jitted_eval_step`).

'jit' is the step of train/step.py over the mesh, its shardings chosen by XLA from the rule table; 'pmap' is
the same step written per device with explicit `psum`s (`jit_per_device_train_step`, data parallel only).
Both take and return a TrainState on the jit shardings and a batch from `sharding.global_batch`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import optax

from transformer_jax import sharding
from transformer_jax.config import ModelConfig
from transformer_jax.experiment import Experiment, OptimizerConfig, TrainConfig
from transformer_jax.model import Transformer
from transformer_jax.train.optimizer import make_optimizer
from transformer_jax.train.state import state_initializer
from transformer_jax.train.step import (
    FAST_COMPILE_OPTIONS,
    jit_eval_step,
    jit_per_device_train_step,
    jit_train_step,
    make_eval_step,
    make_train_step,
    per_device_axes,
)


def compiled_train_step(
    mode: str,
    model: Transformer,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    *,
    label_smoothing: float,
    accum_steps: int,
    mesh: jax.sharding.Mesh,
    state_shardings: Any,
    rules: sharding.Rules = sharding.DEFAULT_RULES,
    compiler_options: dict | None = None,
    dropout_prng: str = "rbg_threefry",
) -> Callable:
    """The jitted `(state, global batch) -> (state, metrics)` of mode 'jit' or 'pmap' (`mesh.mode`)."""
    if mode not in ("jit", "pmap"):
        raise ValueError(f"parallel mode {mode!r} is unknown; use 'jit' or 'pmap' (mesh.mode).")
    per_device = mode == "pmap"
    step = make_train_step(
        model,
        tx,
        schedule,
        label_smoothing=label_smoothing,
        accum_steps=accum_steps,
        axis_name=per_device_axes(rules) if per_device else None,
        dropout_prng=dropout_prng,
    )
    compile_step = jit_per_device_train_step if per_device else jit_train_step
    return compile_step(step, state_shardings, mesh, rules, compiler_options)


class CompiledSteps(NamedTuple):
    init: Callable  # rng -> TrainState on the mesh
    train_step: Callable  # (state, global batch) -> (state, metrics), of the mesh's mode
    eval_step: Callable
    abstract: Any  # the TrainState as ShapeDtypeStructs with shardings (the restore target)


class _StepSettings(NamedTuple):
    """What the compiled steps depend on: the sections that shape them, and the mesh."""

    model: ModelConfig
    optimizer: OptimizerConfig
    train: TrainConfig  # with the fields that do not shape the steps reset, so that they share compilations
    mesh_mode: str
    mesh: jax.sharding.Mesh
    rules: tuple


# TrainConfig fields the compiled steps read; the others (steps, intervals, budget, ...) are set to their defaults
# in the cache key, so that runs which differ only there reuse one compilation within a process.
_STEP_FIELDS = ("label_smoothing", "accum_steps", "fast_compile", "dropout_prng")


def compiled_steps(model_cfg: ModelConfig, experiment: Experiment, mesh, rules: tuple) -> CompiledSteps:
    """Jitted init / train / eval functions, cached so that a second run in one process reuses compilations."""
    train_fields = {name: getattr(experiment.train, name) for name in _STEP_FIELDS}
    settings = _StepSettings(
        model_cfg, experiment.optimizer, TrainConfig(**train_fields), experiment.mesh.mode, mesh, rules
    )
    return _compile(settings)


@functools.lru_cache(maxsize=8)
def _compile(settings: _StepSettings) -> CompiledSteps:
    model_cfg, train_cfg, mesh, rules = settings.model, settings.train, settings.mesh, settings.rules
    tx, schedule = make_optimizer(settings.optimizer, model_cfg.d_model)
    model = Transformer(model_cfg)
    options = FAST_COMPILE_OPTIONS if train_cfg.fast_compile else None
    init, shardings, abstract = state_initializer(model_cfg, tx, mesh, rules, train_cfg.accum_steps, options)
    train_step = compiled_train_step(
        settings.mesh_mode,
        model,
        tx,
        schedule,
        label_smoothing=train_cfg.label_smoothing,
        accum_steps=train_cfg.accum_steps,
        mesh=mesh,
        state_shardings=shardings,
        rules=rules,
        compiler_options=options,
        dropout_prng=train_cfg.dropout_prng,
    )
    return CompiledSteps(
        init, train_step, jitted_eval_step(model_cfg, train_cfg, shardings.params, mesh, rules), abstract
    )


def jitted_eval_step(
    model_cfg: ModelConfig, train_cfg: TrainConfig, params_shardings: Any, mesh: jax.sharding.Mesh, rules: tuple
) -> Callable:
    """The jitted `(params, global batch) -> loss sums` of a run (train.label_smoothing, train.fast_compile), its
    parameters on `params_shardings` (a state's, or train/state.params_shardings without the optimizer)."""
    options = FAST_COMPILE_OPTIONS if train_cfg.fast_compile else None
    eval_step = make_eval_step(Transformer(model_cfg), label_smoothing=train_cfg.label_smoothing)
    return jit_eval_step(eval_step, params_shardings, mesh, rules, options)
