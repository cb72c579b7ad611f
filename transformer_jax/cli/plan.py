"""`plan`: the run's train step (or, --decode, its beam search) compiled for a TPU slice or GPU node on this machine;
what fits per chip, how fast it could go."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from transformer_jax.cli.command import Command
from transformer_jax.errors import ArgumentError


def _declare_plan(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="experiment file with get_config(), e.g. experiments/big.py")
    parser.add_argument(
        "--target",
        required=True,
        help="a TPU slice, GENERATION:TOPOLOGY (v5e:2x2, v5p:2x2x2, ...), or GPUs (h100:8, a100:2x8: 2 nodes of 8)",
    )
    parser.add_argument(
        "--lengths",
        default=None,
        help="comma-separated bucket lengths to compile (default: every bucket; --search: the shortest and longest)",
    )
    parser.add_argument("--search", action="store_true", help="every mesh of the slice that divides the model, ranked")
    parser.add_argument(
        "--decode",
        action="store_true",
        help="plan translation instead: beam search (the config's decode section) on one chip of the target",
    )
    parser.add_argument(
        "--batch", type=int, default=None, help="with --decode: sentences (default: the largest that fits)"
    )
    parser.add_argument(
        "--source-length",
        type=int,
        default=None,
        help="with --decode: tokens per source (default data.max_len)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the report(s) as JSON to this file")


def _lengths(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        lengths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ArgumentError(f"--lengths {text}: give bucket lengths as integers, e.g. --lengths 32,256.") from None
    if not lengths or min(lengths) < 1:
        raise ArgumentError(f"--lengths {text}: give positive bucket lengths, e.g. --lengths 32,256.")
    return lengths


def _plan_decode(plan, experiment, target, args: argparse.Namespace) -> object:
    """`plan --decode`: one batch, or the largest that fits; prints the table, returns the JSON-able plans."""
    if args.batch is not None:
        plans = [plan.plan_decode(experiment, target, batch=args.batch, source_length=args.source_length)]
    else:
        progress = lambda p: print(f"batch {p.batch}: {'fits' if p.fits else 'does not fit'}", file=sys.stderr)  # noqa: E731
        plans = plan.largest_decode_batch(experiment, target, source_length=args.source_length, progress=progress)
    print(plan.format_decode(plans))
    return [p.to_dict() for p in plans]


def _check_decode_arguments(args: argparse.Namespace) -> None:
    for name in ("batch", "source_length"):
        flag, value = f"--{name.replace('_', '-')}", getattr(args, name)
        if value is not None and not args.decode:
            raise ArgumentError(f"{flag} plans translation: give it with --decode.")
        if value is not None and value < 1:
            raise ArgumentError(f"{flag} {value}: give a positive number.")


def _run_plan(args: argparse.Namespace) -> None:
    _check_decode_arguments(args)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the compiler needs no accelerator; the host must not claim one
    import jax

    from transformer_jax import plan

    # A program compiled for a slice this machine does not have cannot be read back from the persistent cache.
    jax.config.update("jax_enable_compilation_cache", False)
    from transformer_jax.experiment import load_experiment

    experiment = load_experiment(args.config, args.config_overrides)
    lengths = _lengths(args.lengths)
    target = plan.parse_target(args.target)  # a bad name fails here, before any compile
    values: object
    if args.decode:
        values = _plan_decode(plan, experiment, target, args)
    elif args.search:
        progress = lambda report: print(f"compiled {report.overrides}", file=sys.stderr, flush=True)  # noqa: E731
        reports = plan.search(experiment, target, lengths=lengths, progress=progress)
        print(plan.format_search(reports))
        values = [report.to_dict() for report in reports]
    else:
        report = plan.plan(experiment, target, lengths=lengths)
        print(plan.format_report(report))
        values = report.to_dict()
    if args.json:
        args.json.write_text(json.dumps(values, indent=1, default=str) + "\n")
        print(f"wrote {args.json}")


COMMANDS = (
    Command(
        "plan",
        help="Compile the train step for a TPU slice or GPUs on this machine: memory per chip, FLOPs, speed estimate.",
        declare=_declare_plan,
        run=_run_plan,
        note="Needs the TPU compiler, or for GPUs jax's CUDA plugin (`make test-plan` builds .venv-tpu with both); "
        "override config fields with --config.section.field=value, as for train.",
        examples=(
            "transformer-jax plan --config experiments/base.py --target v5e:2x2 --config.model.dtype=bfloat16",
            "transformer-jax plan --config experiments/big.py --target v5e:4x4 --search --lengths 32,256",
            "transformer-jax plan --config experiments/big.py --target h100:8 --config.model.dtype=bfloat16",
            "transformer-jax plan --config experiments/base.py --target v5e:2x2 --decode --source-length 128",
        ),
    ),
)
