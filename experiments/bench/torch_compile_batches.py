"""torch eager against torch.compile on a recipe's real batches: what `time_to_bleu.py --torch-compile` pays for.

    python experiments/bench/torch_compile_batches.py --config experiments/multi30k.py --workdir runs/tcb \\
        --config.data.path=/path/to/multi30k [--batches 40] [--rounds 2]

Takes the first --batches batches of the experiment's pipeline (length buckets: a few distinct shapes) and trains
two copies of `TorchTransformer` from the same initial weights on them with time_to_bleu's update (the recipe's
loss, Adam, clipping): eager and `torch.compile(model)` as time_to_bleu compiles it (a shape it has not seen
recompiles, and after the first recompilation the sizes become dynamic). A first pass over the batches compiles;
then --rounds passes, the two taking turns so that they share the machine's drift, give the steady seconds per
update (median over the pass, median over the rounds). Prints a table, writes JSON (experiments/bench/results/ or
--out). Run it alone: it times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import jax
from results_file import write_results  # noqa: E402 - this directory
from time_to_bleu import batch_tensors, torch_update_fn  # noqa: E402

from transformer_jax import cli
from transformer_jax.errors import UserError
from transformer_jax.experiment import load_experiment
from transformer_jax.machine import cpu_model
from transformer_jax.train import loop

LEARNING_RATE = 1e-4  # any: only the time of an update is measured


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    rest, overrides = cli.split_overrides(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="an experiment file, e.g. experiments/multi30k.py")
    parser.add_argument("--workdir", required=True, help="for the tokenizer (trained there if it has none)")
    parser.add_argument("--batches", type=int, default=40, help="batches of the pipeline, each pass")
    parser.add_argument("--rounds", type=int, default=2, help="timed passes of each mode, after the first")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch intra-op threads")
    parser.add_argument("--out", help="JSON output (default experiments/bench/results/torch_compile_batches_*.json)")
    args = parser.parse_args(rest)
    try:
        experiment = load_experiment(args.config, overrides + [("train.progress", "false")])
    except UserError as error:
        parser.error(str(error))
    if experiment.data.pack:
        parser.error("the torch reference has no packed batches: set --config.data.pack=false")
    import torch
    import torch._dynamo

    from transformer_jax.interop.torch import flax_to_torch_state_dict
    from transformer_jax.interop.torch_reference import TorchTransformer

    torch.set_num_threads(args.threads)
    with loop.assemble(experiment, Path(args.workdir)) as trainer:
        cfg, params = trainer.model_cfg, jax.device_get(trainer.state.params)
        batches = [batch_tensors(next(trainer.data.batches)) for _ in range(args.batches)]
    shapes = sorted({(tuple(inputs.shape), tuple(targets.shape)) for inputs, _, targets in batches})
    print(f"{len(batches)} batches, {len(shapes)} shapes (inputs, targets): {shapes}", flush=True)

    forwards = {"eager": lambda model: model, "compile": torch.compile}

    def make(mode: str):
        model = TorchTransformer(cfg)
        model.load_state_dict(flax_to_torch_state_dict(params, cfg))
        return torch_update_fn(experiment, model, forwards[mode](model))

    def one_pass(update) -> list[float]:
        seconds = []
        for tensors in batches:
            began = time.perf_counter()
            update(tensors, LEARNING_RATE)
            seconds.append(time.perf_counter() - began)
        return seconds

    modes = tuple(forwards)
    updates, first_pass, graphs = {}, {}, {}
    for mode in modes:
        updates[mode] = make(mode)
        graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        first_pass[mode] = sum(one_pass(updates[mode]))
        graphs[mode] = torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before
        print(f"{mode}: first pass {first_pass[mode]:.1f} s, {graphs[mode]} graphs compiled", flush=True)
    steady: dict[str, list[float]] = {mode: [] for mode in modes}
    for round_index in range(args.rounds):
        for mode in modes:
            steady[mode].append(statistics.median(one_pass(updates[mode])))
        print(f"round {round_index + 1}: " + ", ".join(f"{m} {s[-1]:.3f} s" for m, s in steady.items()), flush=True)

    tokens = sum(int((inputs != cfg.pad_id).sum() + (targets != cfg.pad_id).sum()) for inputs, _, targets in batches)
    rows = []
    for mode in modes:
        per_update = statistics.median(steady[mode])
        rows.append(
            {
                "mode": mode,
                "first_pass_s": first_pass[mode],
                "graphs_compiled": graphs[mode],
                "steady_s_per_update": per_update,
                "tokens_per_s": tokens / len(batches) / per_update,
                "eager_over_mode": statistics.median(steady["eager"]) / per_update,
            }
        )
    print(f"\n{'mode':8} {'first pass s':>12} {'graphs':>6} {'s/update':>9} {'tok/s':>7} {'vs eager':>8}")
    for row in rows:
        print(
            f"{row['mode']:8} {row['first_pass_s']:12.1f} {row['graphs_compiled']:6d} "
            f"{row['steady_s_per_update']:9.3f} {row['tokens_per_s']:7.0f} {row['eager_over_mode']:8.2f}"
        )
    payload = {
        "cpu": cpu_model(),
        "torch": torch.__version__,
        "threads": args.threads,
        "load_average_at_end": list(os.getloadavg()),
        "config": args.config,
        "batches": len(batches),
        "shapes": [list(shape) for shape in shapes],
        "rows": rows,
    }
    print(f"wrote {write_results('torch_compile_batches', payload, args.out)}")
    return payload


if __name__ == "__main__":
    main()
