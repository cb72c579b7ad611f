"""The library's train step (JAX, jit) against PyTorch eager on the same model, weights and batch, on the CPU.

    .venv/bin/python experiments/bench/jax_vs_torch.py                          # the four shapes, float32
    .venv/bin/python experiments/bench/jax_vs_torch.py --shapes m30k,base --bf16   # also bfloat16 compute
    .venv/bin/python experiments/bench/jax_vs_torch.py --shapes tiny --steps 2 --compile   # torch.compile too

JAX runs the project's own path: `make_optimizer` (Adam 0.9/0.98/1e-9, §5.3 schedule) from the experiment
defaults, `create_train_state`, `make_train_step` (label smoothing 0.1, dropout from the model config) and
`jit_train_step` on a one-device mesh. torch runs `interop.torch.TorchTransformer` with the same weights
(converted exactly), `CrossEntropyLoss(label_smoothing=0.1, ignore_index=pad)` and `torch.optim.Adam` with
the same schedule. Both get the same int32 batch (random ids, no padding, as the data pipeline lays it out:
inputs, decoder_inputs = bos + shifted targets, targets), take turns and never overlap; both use --threads.
Each shape is timed in --rounds rounds of --steps steps, JAX and torch alternating, and the median kept: the
virtual machines this runs on drift in speed by up to ~10% within minutes, and alternating makes both
frameworks see the same drift (the table shows the per-round ratios' range).

Besides tokens/s (source + target tokens per second) each row gives the step's model GFLOP/s (3 x the
analytic forward FLOPs of `accounting.forward_flops`, i.e. forward + backward) and that rate as a fraction
of a plain 2048 x 2048 float32 matmul measured in the same run by each framework. No test asserts any of
this; results go to experiments/bench/results/jax_vs_torch.json (with the load average: measure on an idle
machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from library_step import LibraryStep, synthetic_batch  # noqa: E402 - this directory, imports no jax

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "jax_vs_torch.json"

# name: (ModelConfig overrides of base(), sentences per batch, source = target length)
SHAPES = {
    "tiny": (
        dict(d_model=128, num_heads=4, d_ff=512, num_encoder_layers=2, num_decoder_layers=2, vocab_size=1000),
        32,
        64,
    ),
    "m30k": (
        dict(d_model=256, num_heads=4, d_ff=1024, num_encoder_layers=3, num_decoder_layers=3, vocab_size=8000),
        128,
        32,
    ),
    "small": (
        dict(d_model=128, num_heads=4, d_ff=256, num_encoder_layers=4, num_decoder_layers=4, vocab_size=8000),
        128,
        32,
    ),
    "base": (dict(vocab_size=37000), 64, 32),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, from {list(SHAPES)}")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round, after two warm-up steps")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of --steps steps, JAX and torch taking turns (median kept)"
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for both frameworks")
    parser.add_argument("--dropout", type=float, default=0.1, help="dropout_rate of the model (§5.4)")
    parser.add_argument(
        "--dropout-prng", default=None, help="train.dropout_prng of the JAX step (default: the experiment default)"
    )
    parser.add_argument(
        "--bf16", action="store_true", help="also time bfloat16 compute (float32 parameters; torch: CPU autocast)"
    )
    parser.add_argument("--compile", action="store_true", help="also time torch.compile (minutes on 2 cores)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    return parser.parse_args(argv)


def set_threads(threads: int) -> None:
    """Before jax is imported: one thread count for XLA's CPU backend."""
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = (
        flags + f" --xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} "
        f"intra_op_parallelism_threads={threads}"
    ).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def timed(fn, steps: int, warmup: int = 2) -> float:
    """Seconds per call of fn() over `steps` calls, after `warmup` calls (fn blocks until its result is ready)."""
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - start) / steps


def interleaved(steps_by_framework: dict, steps: int, rounds: int) -> tuple[dict, list[float]]:
    """Median seconds per step of each framework, timed in turns: `rounds` rounds of `steps` steps each, the
    frameworks one after the other within a round, so a drift in the machine's speed hits all of them alike.
    Also returns each round's torch-eager / JAX ratio (its spread shows how steady the machine was)."""
    for fn in steps_by_framework.values():  # two warm-up steps each
        fn()
        fn()
    per_round = {name: [] for name in steps_by_framework}
    for _ in range(rounds):
        for name, fn in steps_by_framework.items():
            per_round[name].append(timed(fn, steps, warmup=0))
    ratios = [t / j for t, j in zip(per_round["torch_eager"], per_round["jax"], strict=True)]
    return {name: statistics.median(times) for name, times in per_round.items()}, ratios


def main(argv=None) -> dict:
    args = parse_args(argv)
    set_threads(args.threads)

    import jax
    import jax.numpy as jnp
    import torch

    from transformer_jax import config as presets
    from transformer_jax import sharding
    from transformer_jax.accounting import forward_flops
    from transformer_jax.experiment import OptimizerConfig, TrainConfig
    from transformer_jax.interop import torch as interop
    from transformer_jax.train.optimizer import make_optimizer
    from transformer_jax.train.state import create_train_state

    torch.set_num_threads(args.threads)
    train_cfg, optimizer_cfg = TrainConfig(), OptimizerConfig()
    mesh = sharding.make_mesh()

    def matmul_gflops() -> dict:
        n = 2048
        a = jnp.ones((n, n), jnp.float32)
        jax_mm = jax.jit(jnp.matmul)
        t = torch.ones(n, n)
        return {
            "jax": 2 * n**3 / timed(lambda: jax_mm(a, a).block_until_ready(), 10) / 1e9,
            "torch": 2 * n**3 / timed(lambda: t @ t, 10) / 1e9,
        }

    def jax_step(cfg, batch) -> tuple:
        """The library's train step as a blocking callable, and the seconds of its first call (compiling)."""
        library_step = LibraryStep(cfg, mesh, args.dropout_prng)

        def one():
            library_step.run(batch)

        start = time.perf_counter()
        one()
        return one, time.perf_counter() - start

    def torch_step(cfg, params, batch, autocast: bool, compiled: bool):
        """The same step in torch (eager or compiled) as a callable."""
        model = interop.TorchTransformer(cfg)
        model.load_state_dict(interop.flax_to_torch_state_dict(params, cfg))
        model.train()
        forward = torch.compile(model) if compiled else model
        adam = torch.optim.Adam(
            model.parameters(), lr=1.0, betas=(optimizer_cfg.adam_b1, optimizer_cfg.adam_b2), eps=optimizer_cfg.adam_eps
        )
        warmup, scale = optimizer_cfg.warmup_steps, optimizer_cfg.lr_scale
        schedule = torch.optim.lr_scheduler.LambdaLR(
            adam, lambda e: scale * cfg.d_model**-0.5 * min((e + 1) ** -0.5, (e + 1) * warmup**-1.5)
        )
        criterion = torch.nn.CrossEntropyLoss(label_smoothing=train_cfg.label_smoothing, ignore_index=cfg.pad_id)
        src, tgt_in, tgt = (
            torch.as_tensor(batch[k], dtype=torch.long) for k in ("inputs", "decoder_inputs", "targets")
        )

        def one():
            adam.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = forward(src, tgt_in)
            loss = criterion(logits.float().reshape(-1, cfg.vocab_size), tgt.reshape(-1))
            loss.backward()
            adam.step()
            schedule.step()
            loss.item()

        return one

    report = {
        "threads": args.threads,
        "jax": jax.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "xla_flags": os.environ.get("XLA_FLAGS"),
        "load_average_at_start": os.getloadavg(),
        "dropout_rate": args.dropout,
        "dropout_prng": args.dropout_prng or train_cfg.dropout_prng,
        "steps": args.steps,
        "rounds": args.rounds,
    }
    report["matmul_gflops"] = matmul_gflops()
    report["results"] = []
    for name in args.shapes.split(","):
        overrides, rows, length = SHAPES[name]
        print(f"running {name} ...", file=sys.stderr, flush=True)
        dtypes = ["float32", "bfloat16"] if args.bf16 else ["float32"]
        for dtype in dtypes:
            cfg = presets.base(**overrides, dropout_rate=args.dropout, dtype=dtype)
            batch = synthetic_batch(cfg, rows, length)
            flops = 3 * forward_flops(cfg, batch=rows, src_len=length, tgt_len=length)["total"]
            tokens = 2 * rows * length
            row = {
                "shape": name,
                "dtype": dtype,
                "rows": rows,
                "length": length,
                "tokens_per_step": tokens,
                "train_gflop_per_step": flops / 1e9,
            }
            jax_one, first = jax_step(cfg, batch)
            params = jax.device_get(
                create_train_state(cfg, make_optimizer(optimizer_cfg, cfg.d_model)[0], 0, mesh)[0].params
            )
            steps = {"jax": jax_one, "torch_eager": torch_step(cfg, params, batch, dtype == "bfloat16", False)}
            if args.compile:
                try:
                    compiled = torch_step(cfg, params, batch, dtype == "bfloat16", True)
                    compiled()  # compiles here, so a failure is caught here
                    steps["torch_compile"] = compiled
                except Exception as error:  # noqa: BLE001 - torch.compile needs a C++ toolchain; record why
                    row["torch_compile_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
            runs, ratios = interleaved(steps, args.steps, args.rounds)
            row["jax_over_torch_eager_per_round"] = ratios
            for framework, seconds in runs.items():
                ceiling = report["matmul_gflops"]["jax" if framework == "jax" else "torch"]
                row[framework] = {
                    "step_s": seconds,
                    "tokens_per_s": tokens / seconds,
                    "gflops": flops / seconds / 1e9,
                    "of_matmul": flops / seconds / 1e9 / ceiling,
                }
            row["jax"]["first_step_s"] = first
            row["jax_over_torch_eager"] = runs["torch_eager"] / runs["jax"]
            report["results"].append(row)
            print_row(row)
    report["load_average_at_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print_table(report)
    print(f"\nwrote {args.out}")
    return report


def print_row(row: dict) -> None:
    print(
        f"  {row['shape']} {row['dtype']}: JAX {row['jax']['step_s']:.3f} s/step, torch eager "
        f"{row['torch_eager']['step_s']:.3f} s/step",
        file=sys.stderr,
        flush=True,
    )


def print_table(report: dict) -> None:
    mm = report["matmul_gflops"]
    print(
        f"\nthreads={report['threads']}  jax {report['jax']}  torch {report['torch']}  load average "
        f"{report['load_average_at_start'][0]:.2f} -> {report['load_average_at_end'][0]:.2f}  "
        f"matmul 2048^2 float32: JAX {mm['jax']:.0f} GFLOP/s, torch {mm['torch']:.0f} GFLOP/s"
    )
    print(
        f"{'shape':<6} {'dtype':<9} {'batch':>8} {'JAX tok/s':>10} {'torch tok/s':>11} {'JAX/torch':>9} "
        f"{'rounds':>11} {'JAX GFLOP/s':>11} {'of matmul':>9} {'torch GFLOP/s':>13} {'compile tok/s':>13}"
    )
    for r in report["results"]:
        compiled = f"{r['torch_compile']['tokens_per_s']:,.0f}" if "torch_compile" in r else "-"
        print(
            f"{r['shape']:<6} {r['dtype']:<9} {r['rows']:>4}x{r['length']:<3} {r['jax']['tokens_per_s']:>10,.0f} "
            f"{r['torch_eager']['tokens_per_s']:>11,.0f} {r['jax_over_torch_eager']:>9.2f} "
            f"{min(r['jax_over_torch_eager_per_round']):>5.2f}-{max(r['jax_over_torch_eager_per_round']):<5.2f} "
            f"{r['jax']['gflops']:>11.0f} {r['jax']['of_matmul']:>9.0%} {r['torch_eager']['gflops']:>13.0f} "
            f"{compiled:>13}"
        )


if __name__ == "__main__":
    main()
