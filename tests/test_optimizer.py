"""The §5.3 learning-rate schedule and the Adam chain against the formula."""

import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.experiment import OptimizerConfig
from transformer_jax.train.optimizer import make_optimizer, transformer_schedule


def paper_lr(step, d_model=512, warmup=4000, scale=1.0):
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def optimizer_cfg(**changes):
    return OptimizerConfig(**changes)  # §5.3 defaults: warm-up 4000, Adam 0.9 / 0.98 / 1e-9, no clipping


@pytest.mark.parametrize("step", [1, 100, 4000, 16000])
def test_schedule_equals_formula_for_base(step):
    schedule = transformer_schedule(512, 4000)
    # optax counts applied updates from 0; the update with count c is step c + 1 of the paper.
    assert float(schedule(step - 1)) == pytest.approx(paper_lr(step), rel=1e-6)


def test_peak_at_warmup_and_decay():
    schedule = transformer_schedule(512, 4000)
    assert float(schedule(3999)) == pytest.approx(6.988e-4, rel=1e-3)  # 512^-0.5 * 4000^-0.5
    assert float(schedule(1)) == pytest.approx(2 * 512**-0.5 * 4000**-1.5, rel=1e-6)
    assert float(schedule(15999)) == pytest.approx(float(schedule(3999)) / 2, rel=1e-6)  # 1/sqrt(step) decay
    assert float(schedule(3998)) < float(schedule(3999)) > float(schedule(4000))


def test_scale_multiplies():
    assert float(transformer_schedule(256, 1000, scale=2.0)(99)) == pytest.approx(paper_lr(100, 256, 1000, 2.0))


def test_first_adam_update_uses_step_one_learning_rate():
    tx, _ = make_optimizer(optimizer_cfg(), d_model=512)
    params = {"w": jnp.array([1.0, -2.0, 3.0])}
    grads = {"w": jnp.array([0.5, -0.25, 2.0])}
    updates, state = tx.update(grads, tx.init(params), params)
    # Adam's first bias-corrected step is -lr * g / (|g| + eps) = -lr * sign(g).
    np.testing.assert_allclose(updates["w"], -paper_lr(1) * np.sign(grads["w"]), rtol=1e-6)
    updates, _ = tx.update(grads, state, params)
    np.testing.assert_allclose(updates["w"], -paper_lr(2) * np.sign(grads["w"]), rtol=1e-6)


def test_adam_constants_are_the_papers():
    tx, _ = make_optimizer(optimizer_cfg(adam_b2=0.5), d_model=512)
    params = {"w": jnp.array([0.0])}
    state = tx.init(params)
    _, state = tx.update({"w": jnp.array([2.0])}, state, params)
    adam_state = state[-1][0]
    np.testing.assert_allclose(adam_state.mu["w"], [0.2])  # (1 - 0.9) * 2
    np.testing.assert_allclose(adam_state.nu["w"], [2.0])  # (1 - 0.5) * 4


def test_global_norm_clipping_happens_before_adam():
    tx, _ = make_optimizer(optimizer_cfg(clip_grad_norm=1.0), d_model=512)
    params = {"w": jnp.zeros(2)}
    _, state = tx.update({"w": jnp.array([3.0, 4.0])}, tx.init(params), params)
    adam_state = state[-1][0]
    np.testing.assert_allclose(adam_state.mu["w"], [0.06, 0.08], rtol=1e-6)  # 0.1 * [3, 4] / 5
    _, state = tx.update({"w": jnp.array([0.3, 0.4])}, tx.init(params), params)  # norm 0.5: unchanged
    np.testing.assert_allclose(state[-1][0].mu["w"], [0.03, 0.04], rtol=1e-6)


def test_the_cooldown_scales_the_schedule_linearly_to_zero_after_its_start():
    schedule = transformer_schedule(128, 500, 1.25, cooldown_start=5000, cooldown_steps=4)
    paper = lambda step: paper_lr(step, 128, 500, 1.25)  # noqa: E731
    # steps 5001..5004 take 4/4, 3/4, 2/4, 1/4 of the paper's rate; 5005 on, nothing; 5000 and before, all of it
    expected = {4000: paper(4000), 5000: paper(5000), 5001: paper(5001), 5002: 0.75 * paper(5002)}
    expected |= {5004: 0.25 * paper(5004), 5005: 0.0, 6000: 0.0}
    for step, lrate in expected.items():
        assert float(schedule(step - 1)) == pytest.approx(lrate, rel=1e-6, abs=1e-12), step


def test_weight_decay_is_adamw_decoupled_from_the_adam_step():
    tx, _ = make_optimizer(optimizer_cfg(weight_decay=0.1), d_model=512)
    params = {"w": jnp.array([1.0, -2.0, 3.0])}
    grads = {"w": jnp.array([0.5, -0.25, 2.0])}
    updates, state = tx.update(grads, tx.init(params), params)
    # AdamW (Loshchilov & Hutter 2019, torch.optim.AdamW): -lr * (Adam's sign(g) on the first step + wd * w);
    # the decay does not pass through Adam's moments.
    np.testing.assert_allclose(updates["w"], -paper_lr(1) * (np.sign(grads["w"]) + 0.1 * params["w"]), rtol=1e-6)
    np.testing.assert_allclose(state[-1][0].mu["w"], 0.1 * grads["w"], rtol=1e-6)
