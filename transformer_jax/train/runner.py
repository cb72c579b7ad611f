"""One interface to the two parallel modes for a training loop (config `mesh.mode`).

'jit' is the step of train/step.py over the mesh; 'pmap' wraps train/pmap_step.py, which the jit path never
imports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import optax

from transformer_jax import parallel
from transformer_jax.model import Transformer
from transformer_jax.train.step import jit_train_step, make_train_step


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
) -> StepRunner:
    """A StepRunner for mode 'jit' or 'pmap' (`mesh.mode`). pmap runs on the mesh's devices.

    jit: place_batch takes this process's rows (`parallel.data_shard`); compiler_options go to jax.jit
    (jax.pmap takes none).
    """
    if mode == "jit":
        step = jit_train_step(
            make_train_step(
                model, tx, schedule, label_smoothing=label_smoothing, accum_steps=accum_steps, dropout_prng=dropout_prng
            ),
            state_shardings,
            mesh,
            rules,
            compiler_options,
        )
        identity = lambda tree: tree  # noqa: E731
        return StepRunner(
            "jit", step, identity, lambda batch: parallel.global_batch(batch, mesh, rules), identity, identity
        )
    if mode != "pmap":
        raise ValueError(f"parallel mode {mode!r} is unknown; use 'jit' or 'pmap' (mesh.mode).")
    if mesh.shape["fsdp"] > 1 or mesh.shape["tensor"] > 1:
        raise ValueError(f"mode 'pmap' is data parallel only; the mesh {dict(mesh.shape)} has fsdp or tensor > 1.")
    if jax.process_count() > 1:
        raise ValueError("mode 'pmap' is single-host here; use mode 'jit' on several hosts.")
    from transformer_jax.train.pmap_step import make_pmap_train_step, replicate, split_batch, unreplicate

    devices = list(mesh.devices.flat)
    step = make_pmap_train_step(
        model,
        tx,
        schedule,
        label_smoothing=label_smoothing,
        accum_steps=accum_steps,
        devices=devices,
        dropout_prng=dropout_prng,
    )

    def host_state(state):
        return jax.device_put(unreplicate(state), state_shardings)

    return StepRunner(
        "pmap",
        step,
        lambda state: replicate(state, devices),
        lambda batch: split_batch(batch, len(devices)),
        host_state,
        unreplicate,
    )
