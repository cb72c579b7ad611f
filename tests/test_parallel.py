"""Sharding rules, the pmap step and the layouts' equality on 8 simulated CPU devices.

The device count must be set before JAX starts, so the layouts run in one subprocess
(tests/helpers/parallel_layouts.py) that trains 2 steps on one global batch (the same at both steps) under every
layout and prints JSON; the tests below read it. The oracle is the one-device run: every layout must give the same
loss sums, gradient norms and updated parameters (float32, 1e-5). SGD makes the update linear in the gradient, so
parameter differences measure the step's arithmetic (see the helper's docstring for why Adam's first step is not used).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
from pathlib import Path
from types import SimpleNamespace

import flax.linen as nn
import numpy as np
import pytest

from transformer_jax import sharding
from transformer_jax.config import tiny
from transformer_jax.experiment import MeshConfig

# One subprocess run feeds the whole module: keep it on one xdist worker (pytest -n N --dist loadgroup).
pytestmark = pytest.mark.xdist_group("parallel_layouts")

HELPER = Path(__file__).parent / "helpers" / "parallel_layouts.py"
STEP_LAYOUTS = ("pmap", "data8", "fsdp4_data2", "tensor2_data4")
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def layouts():
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    command = [
        sys.executable,
        str(HELPER),
        "--steps",
        "2",
        "--fast",
        "--same-batch",
        "--layouts",
        ",".join(("single",) + STEP_LAYOUTS),
        "--bytes-only",
        "fsdp8",
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, f"{' '.join(command)} failed:\n{proc.stderr[-4000:]}"
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["device_count"] == 8
    for name, result in data["layouts"].items():  # informational (pytest -s / -rA shows it)
        print(
            f"{name:>14} mesh={result['mesh']} first call {result.get('first_call_s') or 0:.1f}s "
            f"step {result.get('step_s') or 0:.3f}s params/device {result['param_bytes_per_device'][-1]} B "
            f"of {result['param_bytes_total']} B"
        )
    return data["layouts"]


# ---------------------------------------------------------------------------------------------- equality


@pytest.mark.parametrize("name", STEP_LAYOUTS)
def test_layout_gives_the_one_device_update(layouts, name):
    single, other = layouts["single"], layouts[name]
    assert len(other["metrics"]) == len(single["metrics"]) == 2
    for mine, reference in zip(other["metrics"], single["metrics"]):
        assert mine["tokens"] == reference["tokens"]
        for key in ("loss", "nll", "grad_norm", "learning_rate"):
            np.testing.assert_allclose(mine[key], reference[key], rtol=TOLERANCE, err_msg=key)
        assert mine["updated"] == 1.0
    assert max(other["max_param_diff"]) <= TOLERANCE
    # The comparison is not vacuous: every step moves some parameter by far more than the tolerance.
    assert min(single["max_update_of_single"]) > 100 * TOLERANCE


def test_loss_depends_on_the_update(layouts):
    """Both steps train on the same batch, so step 2's loss differs from step 1's only by step 1's update: equal
    second losses across the layouts check the updated state too. A descent step on that batch lowers its loss."""
    first, second = layouts["single"]["metrics"]
    assert first["tokens"] == second["tokens"]  # the same batch
    assert second["loss"] < first["loss"]


# ---------------------------------------------------------------------------------------------- bytes


def test_fsdp8_holds_an_eighth_of_the_parameters_per_device(layouts):
    result = layouts["fsdp8"]
    total = result["param_bytes_total"]
    per_device = result["param_bytes_per_device"]
    assert len(per_device) == 8
    assert max(per_device) <= total / 8 * 1.01
    assert sum(per_device) == total  # nothing replicated
    adam = result["adam_state_bytes"]  # Adam's moments are sharded like the parameters
    assert adam["per_device"] <= adam["total"] / 8 * 1.01
    assert layouts["single"]["adam_state_bytes"]["per_device"] == layouts["single"]["adam_state_bytes"]["total"]


def test_bytes_per_device_of_each_layout(layouts):
    total = layouts["single"]["param_bytes_total"]
    assert layouts["data8"]["param_bytes_per_device"] == [total] * 8  # replicated
    assert layouts["pmap"]["param_bytes_per_device"] == [total] * 8
    assert max(layouts["fsdp4_data2"]["param_bytes_per_device"]) <= total / 4 * 1.01
    tensor = max(layouts["tensor2_data4"]["param_bytes_per_device"])
    assert total / 2 <= tensor <= total / 2 * 1.05  # heads, mlp, vocab split; LayerNorms replicated


def test_parameter_specs_follow_the_rules(layouts):
    assert layouts["fsdp4_data2"]["param_specs_example"] == {
        "embedding": [None, "fsdp"],
        "ffn_wi_kernel": ["fsdp", None],
        "query_kernel": ["fsdp", None, None],
    }
    assert layouts["tensor2_data4"]["param_specs_example"] == {
        "embedding": ["tensor", None],
        "ffn_wi_kernel": [None, "tensor"],
        "query_kernel": [None, "tensor", None],
    }


def test_decode_cache_is_split_along_batch(layouts):
    cache = layouts["tensor2_data4"]["decode_cache"]
    assert cache["cached_key"]["spec"] == [["data", "fsdp"], "tensor", None, None]
    batch, heads, length, head_dim = cache["cached_key"]["shape"]
    assert cache["cached_key"]["shard_shape"] == [batch // 4, heads // 2, length, head_dim]
    assert cache["memory_key"]["shard_shape"][0] == batch // 4
    assert cache["cache_index"]["spec"] == []
    assert layouts["fsdp4_data2"]["decode_cache"]["cached_key"]["shard_shape"][0] == batch // 8


# ---------------------------------------------------------------------------------------------- rules (in-process)


# Every logical shape the model's arrays have -> its mesh axes under each named table, written out by hand from
# the sharding plan (FSDP splits 'embed', else 'mlp' / 'vocab'; Megatron tensor parallelism splits 'heads',
# 'mlp', 'vocab'; the batch always goes over data and fsdp).
SHAPES = (
    ("vocab", "embed"),  # embedding
    ("embed", "vocab"),  # unshared output projection
    (None, "embed"),  # learned position table
    ("embed", "heads", "kv"),  # query / key / value
    ("heads", "kv", "embed"),  # attention out
    ("embed", "mlp"),  # ffn wi
    ("mlp", "embed"),  # ffn wo
    ("mlp",),  # ffn bias_i
    ("embed",),  # LayerNorm, output biases
    ("heads", "kv"),  # attention biases
    ("batch", "length"),  # every batch array
)
BATCH = ("data", "fsdp")
EXPECTED_SPECS = {
    "dp": [(None, None), (None, None), (None, None), (None, None, None), (None, None, None), (None, None),
           (None, None), (None,), (None,), (None, None), (BATCH, None)],
    "fsdp": [(None, "fsdp"), ("fsdp", None), (None, "fsdp"), ("fsdp", None, None), (None, None, "fsdp"),
             ("fsdp", None), (None, "fsdp"), ("fsdp",), ("fsdp",), (None, None), (BATCH, None)],
    "tensor": [("tensor", None), (None, "tensor"), (None, None), (None, "tensor", None), ("tensor", None, None),
               (None, "tensor"), ("tensor", None), ("tensor",), (None,), ("tensor", None), (BATCH, None)],
    "fsdp_tensor": [("tensor", "fsdp"), ("fsdp", "tensor"), (None, "fsdp"), ("fsdp", "tensor", None),
                    ("tensor", None, "fsdp"), ("fsdp", "tensor"), ("tensor", "fsdp"), ("tensor",), ("fsdp",),
                    ("tensor", None), (BATCH, None)],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXPECTED_SPECS))
def test_rule_table_places_every_array_as_planned(name):
    assert set(EXPECTED_SPECS) == set(sharding.RULE_TABLES)
    got = [tuple(nn.logical_to_mesh_axes(axes, sharding.RULE_TABLES[name])) for axes in SHAPES]
    assert got == EXPECTED_SPECS[name]


def fake_mesh(**sizes):
    return SimpleNamespace(shape={"data": 1, "fsdp": 1, "tensor": 1, **sizes})


def test_rules_chosen_from_mesh_and_config():
    assert sharding.rules_for_mesh(fake_mesh(data=8)) == sharding.make_rules() == tuple(sharding.DEFAULT_RULES)
    assert sharding.rules_for_mesh(fake_mesh(fsdp=4)) == sharding.FSDP_RULES
    assert sharding.rules_for_mesh(fake_mesh(tensor=2)) == sharding.TENSOR_RULES
    assert sharding.rules_for_mesh(fake_mesh(fsdp=2, tensor=2)) == sharding.FSDP_TENSOR_RULES
    assert sharding.rules_named(MeshConfig(data=2, fsdp=4).rules, fake_mesh(data=2, fsdp=4)) == sharding.FSDP_RULES
    assert sharding.rules_named(MeshConfig(rules="tensor").rules, fake_mesh(tensor=2)) == sharding.TENSOR_RULES
    with pytest.raises(ValueError, match="mesh.rules='dp' does not fit"):
        sharding.rules_named(MeshConfig(rules="dp").rules, fake_mesh(fsdp=4))
    with pytest.raises(ValueError, match="unknown"):
        MeshConfig(rules="zero3")


def test_every_named_rule_table_is_a_mesh_rules_choice():
    choices = typing.get_args(typing.get_type_hints(MeshConfig)["rules"])
    assert set(choices) == {"auto", *sharding.RULE_TABLES}


def test_parallel_mode():
    assert MeshConfig().mode == "jit"
    assert MeshConfig(mode="pmap", fsdp=1, tensor=1).mode == "pmap"
    with pytest.raises(ValueError, match="data parallel only"):
        MeshConfig(mode="pmap", fsdp=2)
    with pytest.raises(ValueError, match="unknown"):
        MeshConfig(mode="pjit")


def test_model_must_divide_over_the_mesh():
    sharding.check_model_fits_mesh(tiny(), fake_mesh(fsdp=8), sharding.FSDP_RULES)
    with pytest.raises(ValueError, match="'heads' \\(size 4\\)"):
        sharding.check_model_fits_mesh(tiny(), fake_mesh(tensor=8), sharding.TENSOR_RULES)
    with pytest.raises(ValueError, match="'vocab' \\(size 500\\)"):
        sharding.check_model_fits_mesh(tiny(vocab_size=500), fake_mesh(tensor=8), sharding.TENSOR_RULES)
