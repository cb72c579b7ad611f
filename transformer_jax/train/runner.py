"""The compiled train step of a parallel mode, for a training loop (config `mesh.mode`).

'jit' is the step of train/step.py over the mesh, its shardings chosen by XLA from the rule table; 'pmap' is
the same step written per device with explicit `psum`s (`jit_per_device_train_step`, data parallel only).
Both take and return a TrainState on the jit shardings and a batch from `parallel.global_batch`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax

from transformer_jax import parallel
from transformer_jax.model import Transformer
from transformer_jax.train.step import jit_per_device_train_step, jit_train_step, make_train_step, per_device_axes


def make_runner(
    mode: str,
    model: Transformer,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    *,
    label_smoothing: float,
    accum_steps: int,
    mesh: jax.sharding.Mesh,
    state_shardings: Any,
    rules: parallel.Rules = parallel.DEFAULT_RULES,
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
