"""Saves or restores a train state on N simulated CPU devices; launched by tests/test_checkpoint_topology.py.

    python tests/helpers/checkpoint_topology.py save WORKDIR --devices 8 --mesh data=4,fsdp=2
    python tests/helpers/checkpoint_topology.py resume WORKDIR --devices 4 --mesh data=2,fsdp=2

`save` initialises a TrainState on the mesh (FSDP rules when fsdp > 1), saves it as checkpoint 1 and writes
every leaf to WORKDIR/saved.npz. `resume` restores checkpoint 1 onto its own mesh and writes the leaves to
WORKDIR/resumed_{devices}.npz (each leaf fetched whole), with the shardings it got in a JSON line.
"""

from __future__ import annotations

import argparse
import os
import sys

args_devices = sys.argv[sys.argv.index("--devices") + 1] if "--devices" in sys.argv else "1"
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={args_devices}"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from transformer_jax import checkpoint as ckpt  # noqa: E402
from transformer_jax import sharding  # noqa: E402
from transformer_jax.config import tiny  # noqa: E402
from transformer_jax.experiment import OptimizerConfig  # noqa: E402
from transformer_jax.train.optimizer import make_optimizer  # noqa: E402
from transformer_jax.train.state import create_train_state, state_initializer  # noqa: E402

TRAIN = OptimizerConfig(warmup_steps=10)


def flat_leaves(state) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {jax.tree_util.keystr(path): np.asarray(jax.device_get(leaf)) for path, leaf in leaves}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=("save", "resume"))
    parser.add_argument("workdir")
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--mesh", required=True, help="e.g. data=4,fsdp=2")
    args = parser.parse_args()
    shape = {axis: int(size) for axis, size in (part.split("=") for part in args.mesh.split(","))}
    mesh = sharding.make_mesh(shape)
    rules = sharding.make_rules(fsdp=shape.get("fsdp", 1) > 1)
    model_cfg = tiny(num_encoder_layers=1, num_decoder_layers=1)
    tx, _ = make_optimizer(TRAIN, model_cfg.d_model)
    checkpointer = ckpt.Checkpointer(args.workdir, keep=None, async_save=False)
    if args.action == "save":
        state, _, _ = create_train_state(model_cfg, tx, 7, mesh, rules)
        checkpointer.save(1, state, {"position": 1}, wait=True)
        np.savez(os.path.join(args.workdir, "saved.npz"), **flat_leaves(state))
        specs = {str(leaf.sharding.spec) for leaf in jax.tree.leaves(state.params)}
    else:
        _, _, abstract = state_initializer(model_cfg, tx, mesh, rules)
        state, data = checkpointer.restore(1, abstract)
        np.savez(os.path.join(args.workdir, f"resumed_{args.devices}.npz"), **flat_leaves(state))
        specs = {str(leaf.sharding.spec) for leaf in jax.tree.leaves(state.params)}
        assert data == {"position": 1}, data
    checkpointer.close()
    print(json.dumps({"devices": jax.device_count(), "param_specs": sorted(specs)}))


if __name__ == "__main__":
    main()
