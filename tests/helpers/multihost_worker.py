"""One process of a multi-process CPU training run (launched by tests/test_multihost.py); writes a JSON report.

    python tests/helpers/multihost_worker.py --process-id 0 --num-processes 2 --coordinator 127.0.0.1:PORT \
        --workdir DIR --stop-at 2 --out DIR/p0.json [--devices 2] [--timeout 60]

It joins the run with transformer_jax.distributed.initialize (before any other JAX use), builds a mesh over all
processes' devices (fsdp over every device: the parameters are split across processes), reads only its own rows
of every global batch (data.batching.TrainBatches with shard_index / shard_count from sharding.data_shard),
assembles global arrays with jax.make_array_from_process_local_data, trains with the jitted step up to update
--stop-at (resuming from the latest checkpoint in --workdir, if any), saves an orbax checkpoint from all
processes, and reports the loss sums of its steps; --params writes this process's shards of the final parameters.
With --num-processes 1 it is the single-process reference (use --devices = the total device count).
--launch-only stops after start-up (for the bad-launch tests).

--loop runs the real runner instead, `train.loop.train` on experiments/tiny.py (a small model, the builtin corpus,
fsdp over every device), with the start-up settings in the config's `distributed` section, up to update --stop-at
(resuming from --workdir); it reports the run's summary. Process 0 trains the tokenizer and writes metrics.jsonl.
--prepared DIR reads the training pairs from DIR (`prepare_for_loop`) instead, each process only those of its rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--process-id", type=int, default=None)
    parser.add_argument("--num-processes", type=int, default=None)
    parser.add_argument("--coordinator", default=None)
    parser.add_argument("--timeout", type=int, default=60)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--stop-at", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--params", default=None)
    parser.add_argument("--launch-only", action="store_true")
    parser.add_argument("--loop", action="store_true", help="run transformer_jax.train.loop.train")
    parser.add_argument("--prepared", default="", help="with --loop: the training pairs from this prepared directory")
    parser.add_argument(
        "--cache-dir",
        default=None,
        help="persistent compilation cache (distributed.initialize turns it off for CPU collectives)",
    )
    return parser.parse_args()


def synthetic_pairs(count: int = 64, vocab: int = 512, max_pieces: int = 11, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return [
        (
            rng.integers(3, vocab, rng.integers(1, max_pieces + 1)).tolist(),
            rng.integers(3, vocab, rng.integers(1, max_pieces + 1)).tolist(),
        )
        for _ in range(count)
    ]


def main():
    args = parse()
    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    jax.config.update("jax_disable_most_optimizations", True)  # quicker compiles; same arithmetic everywhere
    if args.cache_dir:
        jax.config.update("jax_compilation_cache_dir", args.cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    from transformer_jax import distributed, peers

    settings = {
        "coordinator_address": args.coordinator,
        "num_processes": args.num_processes,
        "process_id": args.process_id,
        "initialization_timeout": args.timeout,
        "cpu_collectives": "gloo",
    }
    started = time.perf_counter()
    if args.loop:
        run_loop(args, {k: v for k, v in settings.items() if v is not None}, started)
        return
    try:
        from transformer_jax.experiment import DistributedConfig

        info = distributed.initialize(DistributedConfig(**{k: v for k, v in settings.items() if v is not None}))
    except distributed.DistributedStartupError as error:
        print(f"DistributedStartupError: {error}", file=sys.stderr, flush=True)
        sys.exit(3)
    if args.launch_only:
        print(json.dumps({"info": info._asdict(), "startup_s": time.perf_counter() - started}), flush=True)
        peers.shutdown()
        return

    import flax.linen as nn
    import numpy as np
    import optax

    from transformer_jax import sharding
    from transformer_jax.checkpoint import Checkpointer
    from transformer_jax.config import tiny
    from transformer_jax.data.batching import TrainBatches
    from transformer_jax.model import Transformer
    from transformer_jax.train.optimizer import transformer_schedule
    from transformer_jax.train.state import boxed_init_fn, create_train_state
    from transformer_jax.train.step import jit_train_step, make_train_step

    model_cfg = tiny(dropout_rate=0.0, num_encoder_layers=1, num_decoder_layers=1)
    schedule = transformer_schedule(model_cfg.d_model, warmup_steps=10, scale=10.0)
    tx = optax.sgd(
        schedule
    )  # updates linear in the gradient: differences measure the arithmetic (see parallel_layouts)
    mesh = sharding.make_mesh({"data": 1, "fsdp": -1})
    rules = sharding.rules_for_mesh(mesh)
    shard_index, shard_count = sharding.data_shard(mesh, rules)
    batch_shards = mesh.shape["data"] * mesh.shape["fsdp"]
    batches = TrainBatches(
        synthetic_pairs(),
        tokens_per_batch=96,
        max_len=12,
        bucket_boundaries=(12,),
        batch_multiple=batch_shards,
        seed=0,
        shard_index=shard_index,
        shard_count=shard_count,
    )
    checkpointer = Checkpointer(args.workdir, keep=3, async_save=False)
    resumed_from = checkpointer.latest_step()
    if resumed_from is None:
        state, shardings, abstract = create_train_state(model_cfg, tx, seed=0, mesh=mesh, rules=rules)
    else:  # as train/loop.py: the abstract state is the restore target; no initialisation is compiled
        boxed = jax.eval_shape(boxed_init_fn(Transformer(model_cfg), tx, 1), jax.random.PRNGKey(0))
        shardings = sharding.tree_shardings(boxed, mesh, rules)
        abstract = jax.tree.map(
            lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
            nn.unbox(boxed),
            shardings,
        )
        state, data_state = checkpointer.restore(resumed_from, abstract)
        batches.restore(data_state["batches"])
    step_fn = jit_train_step(
        make_train_step(Transformer(model_cfg), tx, schedule, label_smoothing=0.1), shardings, mesh, rules
    )
    local_param_bytes = sum(sharding.per_device_bytes(state.params).values())
    steps = []
    update = int(jax.device_get(state.step))
    while update < args.stop_at:
        local = next(batches)
        batch = sharding.global_batch(local, mesh, rules)
        state, metrics = step_fn(state, batch)
        update += 1
        steps.append(
            {
                "step": update,
                "local_rows": int(local["inputs"].shape[0]),
                "global_rows": int(batch["inputs"].shape[0]),
                **{key: float(metrics[key]) for key in ("loss", "nll", "tokens", "grad_norm")},
            }
        )
    checkpointer.save(update, state, {"batches": batches.state()}, wait=True)
    checkpointer.close()
    if args.params:  # this process's shards of every parameter: {"leaf|start:stop,...": array}
        shards = {}
        for path, leaf in jax.tree_util.tree_flatten_with_path(state.params)[0]:
            for shard in leaf.addressable_shards:
                where = ",".join(
                    f"{s.start or 0}:{s.stop if s.stop is not None else n}" for s, n in zip(shard.index, leaf.shape)
                )
                shards[f"{jax.tree_util.keystr(path)}|{where}"] = np.asarray(shard.data)
        np.savez(args.params, **shards)
    report = {
        "info": info._asdict(),
        "mesh": dict(mesh.shape),
        "shard": [shard_index, shard_count],
        "resumed_from": resumed_from,
        "steps": steps,
        "local_param_bytes": local_param_bytes,
        "total_param_bytes": int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params))),
        "wall_s": time.perf_counter() - started,
    }
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle)
    peers.shutdown()


# tests/conftest.py's seconds-long run of experiments/tiny.py, fsdp over every device, dropout off.
LOOP_CHANGES = {
    "train.eval_every": 2,
    "train.checkpoint_every": 2,
    "train.bleu_every": 2,
    "train.bleu_max_sentences": 8,
    "train.final_bleu": "none",
    "train.async_checkpoints": False,
    "model.dropout_rate": 0.0,
    "mesh.data": 1,
    "mesh.fsdp": -1,
}


def loop_experiment(stop_at: int, **changes):
    """experiments/tiny.py with LOOP_CHANGES and `changes`, stopping at update `stop_at`."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    from conftest import tiny_run_overrides

    from transformer_jax.experiment import load_experiment

    overrides = tiny_run_overrides(stop_at, **LOOP_CHANGES, **changes)
    return load_experiment(str(Path(__file__).parents[2] / "experiments" / "tiny.py"), overrides)


def prepare_for_loop(directory, parts: int = 2, chunk_pairs: int = 400) -> None:
    """The training pairs of the --loop runs prepared into `directory` in `parts` parts, as that many hosts would."""
    from transformer_jax.data.prepared import prepare

    experiment = loop_experiment(1)
    for part in range(parts):
        prepare(
            experiment.data,
            directory,
            seed=experiment.train.seed,
            part=(part, parts),
            workers=1,
            chunk_pairs=chunk_pairs,
        )


def run_loop(args, settings: dict, started: float) -> None:
    """The real runner; distributed start-up happens inside `train` from the config."""
    from transformer_jax import distributed, peers
    from transformer_jax.train import loop

    changes = {f"distributed.{key}": value for key, value in settings.items()}
    if args.prepared:
        changes["data.prepared"] = args.prepared
    summary = loop.train(loop_experiment(args.stop_at, **changes), args.workdir)
    import jax

    report = {
        "info": distributed.initialize()._asdict(),
        "summary": summary,
        "wall_s": time.perf_counter() - started,
        "process_index": jax.process_index(),
    }
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, default=str)
    peers.shutdown()


if __name__ == "__main__":
    main()
