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

train/runner.py gives both modes one interface for a training loop (config `mesh.mode = 'jit' | 'pmap'`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from transformer_jax.model import Transformer
from transformer_jax.train.step import make_train_step

AXIS_NAME = "devices"


def make_pmap_train_step(
    model: Transformer,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    *,
    label_smoothing: float,
    accum_steps: int = 1,
    devices: Sequence[jax.Device] | None = None,
    donate: bool = True,
    dropout_prng: str = "rbg_threefry",
) -> Callable:
    """`jax.pmap`ped step: (replicated state, batch [devices, b, ...]) -> (replicated state, replicated metrics)."""
    step = make_train_step(
        model,
        tx,
        schedule,
        label_smoothing=label_smoothing,
        accum_steps=accum_steps,
        axis_name=AXIS_NAME,
        dropout_prng=dropout_prng,
    )
    return jax.pmap(
        step,
        axis_name=AXIS_NAME,
        devices=None if devices is None else list(devices),
        donate_argnums=(0,) if donate else (),
    )


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
            raise ValueError(
                f"batch[{name!r}] has {value.shape[0]} rows, not a multiple of the {num_devices} "
                f"devices of the pmap step; make the batch size a multiple of the device count."
            )
        out[name] = value.reshape((num_devices, value.shape[0] // num_devices) + value.shape[1:])
    return out
