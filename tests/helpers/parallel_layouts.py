"""Runs the same training steps under several device layouts on 8 simulated CPU devices; prints one JSON line.

    python tests/helpers/parallel_layouts.py [--steps 3] [--layouts single,pmap,...] [--optimizer sgd|adam] [--fast]
        [--same-batch]

Launched as a subprocess by tests/test_parallel.py (the device count must be fixed before JAX is imported);
also a small benchmark: compile and step times per layout (informational only, never asserted).
Layouts: single (1 device), pmap (8), data8, fsdp4_data2, tensor2_data4, fsdp8, fsdp2_tensor2_data2.
Each is compared with 'single': losses, gradient norms and the parameters after every step.

--optimizer sgd (default) makes the update linear in the gradient, so parameter differences measure the step's
arithmetic; with Adam the first update lr * g / (|g| + eps) turns the float32 rounding of near-zero gradient
entries (|g| ~ 1e-7) into parameter differences of a few 1e-5, in any layout, so Adam runs are informational.
--fast turns most XLA optimizations off (about 3x quicker compiles; used by the test).
--same-batch trains every step on the first batch, so the losses of successive steps differ by the updates alone.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from transformer_jax import (
    sharding,  # noqa: E402
)
from transformer_jax.config import tiny  # noqa: E402
from transformer_jax.experiment import OptimizerConfig  # noqa: E402
from transformer_jax.model import Transformer  # noqa: E402
from transformer_jax.train.compiled import compiled_train_step  # noqa: E402
from transformer_jax.train.optimizer import make_optimizer, transformer_schedule  # noqa: E402
from transformer_jax.train.state import boxed_init_fn, create_train_state  # noqa: E402

warnings.filterwarnings("ignore", message=".*donated buffers.*")

LAYOUTS = {
    "single": ("jit", None),
    "pmap": ("pmap", {"data": 8}),
    "data8": ("jit", {"data": 8}),
    "fsdp4_data2": ("jit", {"data": 2, "fsdp": 4}),
    "tensor2_data4": ("jit", {"data": 4, "tensor": 2}),
    "fsdp8": ("jit", {"data": 1, "fsdp": 8}),
    "fsdp2_tensor2_data2": ("jit", {"data": 2, "fsdp": 2, "tensor": 2}),
}
GLOBAL_BATCH, SRC_LEN, TGT_LEN = 16, 12, 10


def spec_entries(spec) -> list:
    """A PartitionSpec as JSON: one entry per dimension, None, a mesh axis, or a list of mesh axes."""
    return [list(entry) if isinstance(entry, tuple) else entry for entry in spec]


def model_config():
    # heads 4, d_model 64, d_ff 256, vocab 512: divisible by every mesh axis size used here.
    return tiny(dropout_rate=0.0, num_encoder_layers=1, num_decoder_layers=1)


def make_batches(steps: int, vocab: int, seed: int = 0) -> list[dict]:
    """Global batches whose rows have very different numbers of real tokens (so devices' token counts differ)."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(steps):
        inputs = rng.integers(3, vocab, (GLOBAL_BATCH, SRC_LEN), dtype=np.int32)
        targets = rng.integers(3, vocab, (GLOBAL_BATCH, TGT_LEN), dtype=np.int32)
        src_lengths = rng.integers(1, SRC_LEN + 1, GLOBAL_BATCH)
        tgt_lengths = rng.integers(1, TGT_LEN + 1, GLOBAL_BATCH)
        tgt_lengths[:4] = 1  # the first device (under data=8) sees only 2 target tokens
        inputs[np.arange(SRC_LEN)[None, :] >= src_lengths[:, None]] = 0
        targets[np.arange(TGT_LEN)[None, :] >= tgt_lengths[:, None]] = 0
        decoder_inputs = np.concatenate([np.ones((GLOBAL_BATCH, 1), np.int32), targets[:, :-1]], axis=1)
        decoder_inputs[targets == 0] = 0
        batches.append({"inputs": inputs, "decoder_inputs": decoder_inputs, "targets": targets})
    return batches


def make_tx(optimizer: str, d_model: int):
    if optimizer == "adam":  # the paper's Adam (§5.3) with a short warm-up
        return make_optimizer(OptimizerConfig(warmup_steps=10), d_model)
    schedule = transformer_schedule(d_model, warmup_steps=10, scale=10.0)  # lr 0.04, 0.08, 0.12, ...
    return optax.sgd(schedule), schedule


def initial_state(optimizer: str):
    """The state initialised once on one device (host copy), reused by every layout."""
    model_cfg = model_config()
    tx, _ = make_tx(optimizer, model_cfg.d_model)
    mesh = sharding.make_mesh(devices=jax.devices()[:1])
    state, _, _ = create_train_state(model_cfg, tx, seed=0, mesh=mesh)
    return jax.device_get(state)


def adam_state_bytes(mesh, rules) -> dict:
    """Bytes of the paper's Adam state (moments follow the parameters' shardings): per device vs in total."""
    import flax.linen as nn

    model_cfg = model_config()
    tx, _ = make_tx("adam", model_cfg.d_model)
    boxed = jax.eval_shape(boxed_init_fn(Transformer(model_cfg), tx, 1), jax.random.PRNGKey(0))
    shardings = sharding.tree_shardings(boxed, mesh, rules)
    leaves = jax.tree.leaves(nn.unbox(boxed).opt_state)
    placements = jax.tree.leaves(shardings.opt_state)
    assert len(leaves) == len(placements)
    per_device = sum(
        int(np.prod(s.shard_shape(leaf.shape))) * leaf.dtype.itemsize for leaf, s in zip(leaves, placements)
    )
    return {"per_device": per_device, "total": sum(int(np.prod(leaf.shape)) * leaf.dtype.itemsize for leaf in leaves)}


def cache_layout(mesh, rules, params, batch: int = 8) -> dict:
    """Decode-cache shardings (decoding.cache_shardings) of a batch of 8 sources, placed on the mesh."""
    import jax.numpy as jnp

    from transformer_jax.decoding import cache_shardings, init_cache

    model = Transformer(model_config())

    def make(params, inputs):
        encoded = model.apply({"params": params}, inputs, method="encode")
        return init_cache(model, params, encoded, inputs, TGT_LEN)

    abstract = jax.eval_shape(make, params, jax.ShapeDtypeStruct((batch, SRC_LEN), jnp.int32))
    shardings = cache_shardings(abstract, mesh, rules)
    placed = jax.tree.map(lambda a, s: jax.device_put(np.zeros(a.shape, a.dtype), s), abstract, shardings)
    layer = placed["decoder"]["layer_0"]
    out = {}
    for name, leaf in (
        ("cached_key", layer["self_attention"]["keys_values"].key),
        ("memory_key", layer["cross_attention"]["memory"].key),
        ("cache_index", layer["self_attention"]["keys_values"].index),
    ):
        out[name] = {
            "shape": list(leaf.shape),
            "spec": spec_entries(leaf.sharding.spec),
            "shard_shape": list(leaf.addressable_shards[0].data.shape),
        }
    return out


def run_layout(name: str, steps: int, batches: list[dict], host_state, optimizer: str = "sgd") -> tuple[dict, list]:
    mode, shape = LAYOUTS[name]
    model_cfg = model_config()
    tx, schedule = make_tx(optimizer, model_cfg.d_model)
    mesh = sharding.make_mesh(shape) if shape else sharding.make_mesh(devices=jax.devices()[:1])
    rules = sharding.rules_for_mesh(mesh)
    sharding.check_model_fits_mesh(model_cfg, mesh, rules)
    abstract = jax.eval_shape(boxed_init_fn(Transformer(model_cfg), tx, 1), jax.random.PRNGKey(0))
    shardings = sharding.tree_shardings(abstract, mesh, rules)
    state = jax.device_put(host_state, shardings)
    param_bytes = sharding.per_device_bytes(state.params)
    opt_bytes = sharding.per_device_bytes(state.opt_state)
    result = {
        "mode": mode,
        "mesh": {k: int(v) for k, v in mesh.shape.items()},
        "devices": int(mesh.devices.size),
        "param_bytes_per_device": sorted(param_bytes.values()),
        "opt_bytes_per_device": sorted(opt_bytes.values()),
        "param_bytes_total": int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(host_state.params))),
        "param_specs_example": {
            "embedding": spec_entries(shardings.params["embed"]["embedding"].spec),
            "ffn_wi_kernel": spec_entries(shardings.params["encoder"]["layer_0"]["ffn"]["wi"]["kernel"].spec),
            "query_kernel": spec_entries(
                shardings.params["encoder"]["layer_0"]["self_attention"]["query"]["kernel"].spec
            ),
        },
    }
    result["adam_state_bytes"] = adam_state_bytes(mesh, rules)
    result["decode_cache"] = cache_layout(mesh, rules, host_state.params)
    if steps == 0:
        return result, []
    train_step = compiled_train_step(
        mode,
        Transformer(model_cfg),
        tx,
        schedule,
        label_smoothing=0.1,
        accum_steps=1,
        mesh=mesh,
        state_shardings=shardings,
        rules=rules,
    )
    times, history, snapshots = [], [], []
    for batch in batches[:steps]:
        placed = sharding.global_batch(batch, mesh, rules)
        start = time.perf_counter()
        state, metrics = train_step(state, placed)
        jax.block_until_ready((state, metrics))
        times.append(time.perf_counter() - start)
        metrics = jax.device_get(metrics)
        history.append({key: float(value) for key, value in metrics.items()})
        snapshots.append([np.asarray(x) for x in jax.tree.leaves(jax.device_get(state.params))])
    step_s = float(np.mean(times[1:])) if len(times) > 1 else None
    result.update(first_call_s=times[0], step_s=step_s, compile_s=times[0] - (step_s or 0.0), metrics=history)
    return result, snapshots


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--bytes-only", default="", help="layouts whose bytes are measured without a step")
    parser.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"))
    parser.add_argument("--fast", action="store_true")
    parser.add_argument("--same-batch", action="store_true", help="every step trains on the first batch")
    args = parser.parse_args()
    if args.fast:
        jax.config.update("jax_disable_most_optimizations", True)
    names = [n for n in args.layouts.split(",") if n]
    names = ["single"] + [n for n in names if n != "single"]
    bytes_only = [n for n in args.bytes_only.split(",") if n]
    started = time.perf_counter()
    batches = make_batches(args.steps, model_config().vocab_size)
    if args.same_batch:
        batches = batches[:1] * args.steps
    host_state = initial_state(args.optimizer)
    results, reference = {}, None
    for name in names + bytes_only:
        result, snapshots = run_layout(
            name, 0 if name in bytes_only else args.steps, batches, host_state, args.optimizer
        )
        if snapshots:
            if reference is None:
                reference = snapshots
            previous = [[np.asarray(x) for x in jax.tree.leaves(host_state.params)]] + reference[:-1]
            result["max_param_diff"] = [
                float(max(np.max(np.abs(a - b)) for a, b in zip(snap, ref))) for snap, ref in zip(snapshots, reference)
            ]
            result["max_update_of_single"] = [
                float(max(np.max(np.abs(a - b)) for a, b in zip(ref, prev))) for ref, prev in zip(reference, previous)
            ]
        results[name] = result
    print(
        json.dumps(
            {
                "device_count": jax.device_count(),
                "steps": args.steps,
                "optimizer": args.optimizer,
                "fast": args.fast,
                "same_batch": args.same_batch,
                "total_s": time.perf_counter() - started,
                "layouts": results,
            }
        )
    )


if __name__ == "__main__":
    main()
