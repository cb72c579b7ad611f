"""`prepare`: the training split tokenized once into sharded token files read by index (data/prepared.py)."""

from __future__ import annotations

import argparse
import re

from transformer_jax.cli.command import Command
from transformer_jax.errors import ArgumentError, UsageError


def _declare_prepare(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="experiment file whose data section names the text")
    parser.add_argument("--output", required=True, help="directory for spm.model, the shards and the manifest")
    parser.add_argument(
        "--part", default="0/1", metavar="I/N", help="on host I of N: encode shards k with k %% N == I (default 0/1)"
    )
    parser.add_argument("--workers", type=int, default=0, help="encoding processes (default: one per core)")
    parser.add_argument("--chunk-pairs", type=int, default=1_000_000, help="pairs per shard (default 1,000,000)")


def _run_prepare(args: argparse.Namespace) -> None:
    from pathlib import Path

    from transformer_jax.data.prepared import prepare
    from transformer_jax.experiment import load_experiment

    match = re.fullmatch(r"(\d+)/(\d+)", args.part)
    if match is None or not int(match[1]) < int(match[2]):
        raise ArgumentError(f"--part {args.part}: give I/N with 0 <= I < N, e.g. --part 0/4 on the first of 4 hosts.")
    if args.workers < 0 or args.chunk_pairs < 1:
        raise ArgumentError("--workers must be >= 0 (0: one per core) and --chunk-pairs >= 1.")
    experiment = load_experiment(args.config, args.config_overrides)
    if experiment.data.prepared:
        raise UsageError(f"{args.config} already reads prepared data (data.prepared={experiment.data.prepared!r}).")
    part = (int(match[1]), int(match[2]))
    manifest = prepare(
        experiment.data,
        Path(args.output),
        seed=experiment.train.seed,
        part=part,
        workers=args.workers,
        chunk_pairs=args.chunk_pairs,
    )
    pairs = sum(manifest.shards.values())
    print(
        f"prepared {pairs} pairs in {len(manifest.shards)} shards (part {part[0]} of {part[1]}) in {args.output}; "
        f"train with --config.data.prepared={args.output}"
    )


COMMANDS = (
    Command(
        "prepare",
        help="Tokenize the training split once into sharded token files that training reads by index.",
        declare=_declare_prepare,
        run=_run_prepare,
        note="The tokenizer is trained as `train` trains it (or the output's spm.model is reused); validation and test "
        "stay text. On several hosts, run each part with --part I/N into one shared --output.",
        examples=(
            "transformer-jax prepare --config experiments/base.py --output data/wmt14-en-de",
            "transformer-jax train --config experiments/base.py --workdir runs/base "
            "--config.data.prepared=data/wmt14-en-de",
            "transformer-jax prepare --config experiments/big.py --output /shared/wmt14-en-fr --part 3/8",
        ),
    ),
)
