"""Checkpoints restore onto any device layout: saved on 8 devices (data 4 x FSDP 2), read on 1 and resumed on 4.

Each run needs its own device count, so the saving and resuming processes are subprocesses
(tests/helpers/checkpoint_topology.py); this process reads the parameters on its one device.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from transformer_jax import workdir as ckpt

HELPER = Path(__file__).parent / "helpers" / "checkpoint_topology.py"
pytestmark = pytest.mark.xdist_group("checkpoint_topology")


def run_helper(*args) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, str(HELPER), *map(str, args)], capture_output=True, text=True, timeout=600, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def saved_on_eight(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("topology")
    info = run_helper("save", workdir, "--devices", 8, "--mesh", "data=4,fsdp=2")
    assert info["devices"] == 8 and any("fsdp" in spec for spec in info["param_specs"])  # really sharded
    return workdir, dict(np.load(workdir / "saved.npz"))


def test_parameters_of_an_fsdp_checkpoint_load_on_one_device(saved_on_eight):
    workdir, saved = saved_on_eight
    params = ckpt.load_params(workdir)
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    assert len(flat) == sum(key.startswith(".params") for key in saved)
    for path, leaf in flat:
        np.testing.assert_array_equal(np.asarray(leaf), saved[".params" + jax.tree_util.keystr(path)])


def test_averaging_and_named_parameters_work_on_one_device(saved_on_eight):
    workdir, saved = saved_on_eight
    averaged = ckpt.average_params(workdir, steps=[1])
    ckpt.save_named_params(workdir, "averaged", averaged, [1])
    restored = ckpt.restore_named_params(workdir, "averaged")
    kernel = restored["embed"]["embedding"]
    np.testing.assert_array_equal(np.asarray(kernel), saved[".params['embed']['embedding']"])


def test_training_resumes_on_four_devices_with_the_saved_values(saved_on_eight):
    workdir, saved = saved_on_eight
    info = run_helper("resume", workdir, "--devices", 4, "--mesh", "data=2,fsdp=2")
    assert info["devices"] == 4
    resumed = dict(np.load(workdir / "resumed_4.npz"))
    assert resumed.keys() == saved.keys()
    for key, value in saved.items():
        np.testing.assert_array_equal(resumed[key], value, err_msg=key)


def test_training_saved_on_four_devices_resumes_on_eight(tmp_path):
    run_helper("save", tmp_path, "--devices", 4, "--mesh", "data=2,fsdp=2")
    info = run_helper("resume", tmp_path, "--devices", 8, "--mesh", "data=4,fsdp=2")
    assert info["devices"] == 8
    saved, resumed = dict(np.load(tmp_path / "saved.npz")), dict(np.load(tmp_path / "resumed_8.npz"))
    assert resumed.keys() == saved.keys()
    for key, value in saved.items():
        np.testing.assert_array_equal(resumed[key], value, err_msg=key)
