"""Adam with the warm-up / inverse-square-root learning rate of the paper (§5.3), plus optional clipping and
decoupled weight decay.

    lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)

With a cool-down (`cooldown_steps` > 0, not in the paper: the warm-up–stable–decay shape of Hägele et al. 2024,
"Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations") the rate is further multiplied by
clip((cooldown_start + cooldown_steps + 1 - step) / cooldown_steps, 0, 1): 1 up to update cooldown_start, then
falling linearly to 1 / cooldown_steps at the cool-down's last update and 0 after it.

With `weight_decay` > 0 (not in the paper) Adam becomes AdamW (Loshchilov & Hutter 2019): every parameter also
moves by -lrate * weight_decay * itself, as torch.optim.AdamW over model.parameters() and fairseq's --weight-decay do.

`step` counts optimizer updates from 1: the first update uses step = 1. optax passes the number of updates
already applied (`count`, 0 for the first), so the schedule evaluates the formula at count + 1.
Gradient accumulation is done explicitly in `train/step.py` (it sums token-weighted gradients, so k
micro-batches equal one batch of their concatenation exactly); this module only sees whole updates.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

from transformer_jax.experiment import OptimizerConfig


def transformer_schedule(
    d_model: int, warmup_steps: int = 4000, scale: float = 1.0, cooldown_start: int = 0, cooldown_steps: int = 0
) -> optax.Schedule:
    """§5.3 schedule (and the optional cool-down) as an optax schedule of the update count (0-based count ->
    1-based step)."""
    if warmup_steps <= 0:
        raise ValueError(f"warmup_steps={warmup_steps} must be positive.")

    def schedule(count):
        step = jnp.asarray(count, jnp.float32) + 1.0
        lrate = scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)
        if cooldown_steps > 0:
            lrate *= jnp.clip((cooldown_start + cooldown_steps + 1.0 - step) / cooldown_steps, 0.0, 1.0)
        return lrate

    return schedule


def make_optimizer(optimizer: OptimizerConfig, d_model: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """Optax chain from the `optimizer` config section: [clip_by_global_norm] -> Adam(schedule), AdamW with
    weight_decay > 0; clip <= 0 = off."""
    schedule = transformer_schedule(
        d_model, optimizer.warmup_steps, optimizer.lr_scale, optimizer.cooldown_start, optimizer.cooldown_steps
    )
    parts = []
    if optimizer.clip_grad_norm > 0:
        parts.append(optax.clip_by_global_norm(optimizer.clip_grad_norm))
    adam = dict(b1=optimizer.adam_b1, b2=optimizer.adam_b2, eps=optimizer.adam_eps)
    if optimizer.weight_decay > 0:
        parts.append(optax.adamw(schedule, weight_decay=optimizer.weight_decay, **adam))
    else:
        parts.append(optax.adam(schedule, **adam))
    return optax.chain(*parts), schedule
