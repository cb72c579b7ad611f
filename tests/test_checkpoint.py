"""Checkpointer: exact round trip, keep-last-N, and refusal of a differently shaped model."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer_jax import sharding
from transformer_jax.checkpoint import Checkpointer, CheckpointMismatchError, NonFiniteStateError, describe_mismatch
from transformer_jax.train.state import TrainState
from transformer_jax.workdir import average_last, average_params, load_config, save_config


def make_state(width=3, seed=0):
    key = jax.random.PRNGKey(seed)
    params = {
        "dense": {"kernel": jax.random.normal(key, (2, width)), "bias": jnp.arange(width, dtype=jnp.float32)},
        "norm": {"scale": jnp.ones(2)},
    }
    tx = optax.adam(1e-3)
    opt_state = tx.init(params)
    _, opt_state = tx.update(jax.tree.map(jnp.ones_like, params), opt_state, params)  # non-trivial moments
    return TrainState(step=jnp.array(7, jnp.int32), params=params, opt_state=opt_state, rng=jax.random.PRNGKey(42))


def abstract_of(state):
    replicated = sharding.replicated(sharding.make_mesh())
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), state)


def test_round_trip_is_exact_and_keeps_last_n(tmp_path):
    state = make_state()
    checkpointer = Checkpointer(tmp_path, keep=2, async_save=True)
    for step in (1, 2, 3):
        checkpointer.save(
            step, state.replace(step=jnp.array(step, jnp.int32)), {"batches": {"epoch": 0, "index": step}}
        )
    checkpointer.wait()
    assert checkpointer.all_steps() == [2, 3]
    restored, data = checkpointer.restore(3, abstract_of(state))
    checkpointer.close()
    assert data == {"batches": {"epoch": 0, "index": 3}}
    assert int(restored.step) == 3
    jax.tree.map(np.testing.assert_array_equal, restored.params, state.params)
    jax.tree.map(np.testing.assert_array_equal, restored.opt_state, state.opt_state)
    np.testing.assert_array_equal(restored.rng, state.rng)
    assert isinstance(restored.opt_state[0], optax.ScaleByAdamState)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_state_that_is_not_finite_is_never_saved(tmp_path, bad):
    checkpointer = Checkpointer(tmp_path, keep=1, async_save=True)
    checkpointer.save(1, make_state())
    broken = make_state()
    broken = broken.replace(params={**broken.params, "norm": {"scale": jnp.array([1.0, bad])}})
    with pytest.raises(NonFiniteStateError, match="update 2: .* not saved"):
        checkpointer.save(2, broken)
    moments = make_state().opt_state[0]._replace(nu=jax.tree.map(lambda x: x.at[0].set(bad), make_state().params))
    with pytest.raises(NonFiniteStateError):  # an optimizer moment counts too
        checkpointer.save(3, make_state().replace(opt_state=(moments, *make_state().opt_state[1:])))
    checkpointer.wait()
    assert checkpointer.all_steps() == [1]  # keep=1 did not rotate the good one out
    checkpointer.close()


def test_a_new_manager_finds_the_saved_steps(tmp_path):
    Checkpointer(tmp_path, async_save=False).save(5, make_state())
    again = Checkpointer(tmp_path)
    assert again.latest_step() == 5
    assert again.saved_param_shapes(5)["dense/kernel"] == (2, 3)
    again.close()


def test_differently_shaped_model_is_refused_with_names(tmp_path):
    checkpointer = Checkpointer(tmp_path, async_save=False)
    checkpointer.save(1, make_state(width=3), {"x": 1})
    files_before = sorted(p.name for p in tmp_path.rglob("*"))
    other = make_state(width=4)
    other = other.replace(params={**other.params, "extra": {"w": jnp.zeros(1)}})
    with pytest.raises(CheckpointMismatchError) as error:
        checkpointer.restore(1, abstract_of(other))
    message = str(error.value)
    assert "dense/kernel: checkpoint (2, 3) vs config (2, 4)" in message
    assert "dense/bias: checkpoint (3,) vs config (4,)" in message
    assert "extra/w: in the config (1,), not in the checkpoint" in message
    assert "norm/scale" not in message and "3 parameter(s) differ" in message
    assert sorted(p.name for p in tmp_path.rglob("*")) == files_before
    checkpointer.close()


def test_describe_mismatch_lists_both_directions():
    lines = describe_mismatch({"a": (1,), "b": (2,)}, {"a": (1,), "c": (3,)})
    assert lines == ["  b: in the checkpoint (2,), not in the config", "  c: in the config (3,), not in the checkpoint"]


def test_average_last_draws_only_on_the_requested_part_of_the_run(tmp_path):
    checkpointer = Checkpointer(tmp_path, async_save=False)
    states = {step: make_state(seed=step) for step in (2, 4, 6, 8)}
    for step, state in states.items():
        checkpointer.save(step, state)
    checkpointer.close()
    assert average_last(tmp_path, last=8)[0] == [2, 4, 6, 8]
    assert average_last(tmp_path, last=8, from_fraction=0.5)[0] == [4, 6, 8]  # steps >= 0.5 * 8
    steps, _ = average_last(tmp_path, last=2, from_fraction=0.3)
    assert steps == [6, 8]
    with pytest.raises(ValueError, match="--from-fraction 1.5"):
        average_last(tmp_path, last=2, from_fraction=1.5)


def test_average_params_is_the_elementwise_mean(tmp_path):
    checkpointer = Checkpointer(tmp_path, async_save=False)
    states = [make_state(seed=seed) for seed in range(3)]
    for step, state in enumerate(states, start=1):
        checkpointer.save(step, state)
    checkpointer.close()
    mean = average_params(tmp_path, last=2)
    np.testing.assert_allclose(
        mean["dense"]["kernel"],
        (states[1].params["dense"]["kernel"] + states[2].params["dense"]["kernel"]) / 2,
        rtol=1e-6,
    )


def test_config_json_round_trip(tmp_path):
    save_config(tmp_path, {"model": {"d_model": 8}, "train": {"steps": 3}})
    assert load_config(tmp_path)["model"]["d_model"] == 8
    with pytest.raises(FileNotFoundError, match="transformer-jax train"):
        load_config(tmp_path / "missing")
