"""The classic `jax.pmap` data-parallel train step: replicated state, one slice of the batch per device.

It computes the same update as the jitted step of train/step.py (to float32 rounding): the loss is a *sum* over
target tokens divided by the global token count, so each device differentiates the sum of its own slice and the
step `psum`s the gradient sums and the token counts over devices before dividing. (`pmean` of per-device *mean*
gradients would weight a device's tokens by 1 / its own count, which differs whenever devices see different
numbers of real tokens -- always, with padding.)

    step = make_pmap_train_step(model, tx, schedule, label_smoothing=0.1)
    state = replicate(state)                           # [devices, ...] copies
    state, metrics = step(state, split_batch(batch))   # batch [devices * b, L] -> [devices, b, L]
    host_state = unreplicate(state)                    # e.g. for checkpoints

Dropout: the key of a step is fold_in(fold_in(state.rng, state.step), device index), so each device draws its own
masks and a resumed run draws the same ones; these are *not* the masks of the jit step (which draws them for the
global batch at once), so with dropout the two modes agree in distribution, not bit for bit.

`make_runner` gives both modes one interface for a training loop (config `mesh.mode = 'jit' | 'pmap'`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer_jax import distributed, parallel
from transformer_jax.model import Transformer
from transformer_jax.train.step import jit_train_step, make_train_step

AXIS_NAME = "devices"


def make_pmap_train_step(model: Transformer, tx: optax.GradientTransformation, schedule: optax.Schedule, *,
                         label_smoothing: float, accum_steps: int = 1,
                         devices: Sequence[jax.Device] | None = None, donate: bool = True,
                         dropout_prng: str = "rbg") -> Callable:
    """`jax.pmap`ped step: (replicated state, batch [devices, b, ...]) -> (replicated state, replicated metrics)."""
    step = make_train_step(model, tx, schedule, label_smoothing=label_smoothing, accum_steps=accum_steps,
                           axis_name=AXIS_NAME, dropout_prng=dropout_prng)
    return jax.pmap(step, axis_name=AXIS_NAME, devices=None if devices is None else list(devices),
                    donate_argnums=(0,) if donate else ())


def replicate(tree: Any, devices: Sequence[jax.Device] | None = None) -> Any:
    """One copy of every leaf per device (leading axis = devices), as `jax.pmap` expects.

    The copies are placed exactly as the pmapped step returns its outputs (a 1-D mesh named AXIS_NAME over the
    same devices), so the second call reuses the first call's compilation.
    """
    devices = list(jax.local_devices() if devices is None else devices)
    sharding = NamedSharding(Mesh(np.asarray(devices), (AXIS_NAME,)), PartitionSpec(AXIS_NAME))
    return jax.tree.map(lambda x: jax.device_put(np.stack([np.asarray(x)] * len(devices)), sharding), tree)


def unreplicate(tree: Any) -> Any:
    """The copy on the first device (all copies are equal after a pmap step)."""
    return jax.tree.map(lambda x: x[0], tree)


def split_batch(batch: Mapping[str, np.ndarray], num_devices: int | None = None) -> dict:
    """[global_batch, ...] host arrays -> [devices, global_batch / devices, ...] (device d gets rows d*b:(d+1)*b)."""
    num_devices = jax.local_device_count() if num_devices is None else num_devices
    out = {}
    for name, value in batch.items():
        value = np.asarray(value)
        if value.shape[0] % num_devices:
            raise ValueError(f"batch[{name!r}] has {value.shape[0]} rows, not a multiple of the {num_devices} "
                             f"devices of the pmap step; make the batch size a multiple of the device count.")
        out[name] = value.reshape((num_devices, value.shape[0] // num_devices) + value.shape[1:])
    return out


class StepRunner(NamedTuple):
    """One interface to both parallel modes, for a training loop.

        state = runner.place_state(state)            # after init / restore (a mesh-placed TrainState)
        state, metrics = runner.step(state, runner.place_batch(host_batch))
        saved = runner.host_state(state)             # before checkpointing (a mesh-placed TrainState)
        metrics = runner.metrics(metrics)            # global sums, one copy

    mode 'jit': the step of train/step.py over the mesh; place_state / host_state are the identity.
    mode 'pmap': replicated state on the mesh's devices; host_state returns the state placed back on the
    jit shardings (`state_shardings`) so checkpoints are the same in both modes.
    """

    mode: str
    step: Callable
    place_state: Callable
    place_batch: Callable
    host_state: Callable
    metrics: Callable


def make_runner(mode: str, model: Transformer, tx: optax.GradientTransformation, schedule: optax.Schedule, *,
                label_smoothing: float, accum_steps: int, mesh: jax.sharding.Mesh, state_shardings: Any,
                rules: parallel.Rules = parallel.DEFAULT_RULES, compiler_options: dict | None = None,
                dropout_prng: str = "rbg") -> StepRunner:
    """A StepRunner for mode 'jit' or 'pmap' (see `parallel.parallel_mode`). pmap runs on the mesh's devices.

    jit: place_batch takes this process's rows (`distributed.data_shard`); compiler_options go to jax.jit
    (jax.pmap takes none).
    """
    if mode == "jit":
        step = jit_train_step(make_train_step(model, tx, schedule, label_smoothing=label_smoothing,
                                              accum_steps=accum_steps, dropout_prng=dropout_prng),
                              state_shardings, mesh, rules,
                              compiler_options)
        identity = lambda tree: tree  # noqa: E731
        return StepRunner("jit", step, identity, lambda batch: distributed.global_batch(batch, mesh, rules),
                          identity, identity)
    if mode != "pmap":
        raise ValueError(f"parallel mode {mode!r} is unknown; use one of {parallel.PARALLEL_MODES}.")
    if mesh.shape["fsdp"] > 1 or mesh.shape["tensor"] > 1:
        raise ValueError(f"mode 'pmap' is data parallel only; the mesh {dict(mesh.shape)} has fsdp or tensor > 1.")
    if jax.process_count() > 1:
        raise ValueError("mode 'pmap' is single-host here; use mode 'jit' on several hosts.")
    devices = list(mesh.devices.flat)
    step = make_pmap_train_step(model, tx, schedule, label_smoothing=label_smoothing, accum_steps=accum_steps,
                                devices=devices, dropout_prng=dropout_prng)

    def host_state(state):
        return jax.device_put(unreplicate(state), state_shardings)

    return StepRunner("pmap", step, lambda state: replicate(state, devices),
                      lambda batch: split_batch(batch, len(devices)), host_state, unreplicate)
