"""Checks on real data that prepared pairs (`prepare`, data.prepared) give the batches encoding at start-up gives.

    .venv/bin/python experiments/same_batches.py --config experiments/multi30k.py \
        --config.data.path=../shared/data/multi30k [--epochs 2] [--shards 2]

Prepares the config's training split into a temporary directory, then compares every batch of --epochs epochs of
`TrainBatches` over the prepared pairs with `TrainBatches` over the text encoded in memory by the same SentencePiece
model, on each of --shards process shards; prints how many batches (and real tokens) were equal, exits 1 on the
first difference.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np


def main() -> int:
    from transformer_jax import cli
    from transformer_jax.data.batching import TrainBatches
    from transformer_jax.data.prepared import PreparedPairs, prepare
    from transformer_jax.data.sources import source_from_config
    from transformer_jax.data.tokenizer import load_tokenizer
    from transformer_jax.experiment import load_experiment

    rest, overrides = cli.split_overrides(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--shards", type=int, default=2)
    args = parser.parse_args(rest)
    experiment = load_experiment(args.config, overrides)
    data = experiment.data
    with tempfile.TemporaryDirectory() as directory:
        prepare(data, Path(directory), seed=experiment.train.seed, part=(0, 1), workers=0, chunk_pairs=10_000)
        tokenizer = load_tokenizer(directory)
        in_memory = tokenizer.encode_pairs(source_from_config(data, ("train",)).pairs("train"))
        options = dict(
            tokens_per_batch=data.tokens_per_batch,
            max_len=data.max_len,
            seed=experiment.train.seed,
            bucket_boundaries=tuple(data.bucket_boundaries) or None,
            pack=data.pack,
            batch_multiple=args.shards,
            shard_count=args.shards,
        )
        batches = tokens = 0
        for shard in range(args.shards):
            expected = TrainBatches(in_memory, shard_index=shard, **options)
            actual = TrainBatches(PreparedPairs(directory), shard_index=shard, **options)
            while expected.epoch < args.epochs:
                want, got = next(expected), next(actual)
                if want.keys() != got.keys() or any(not np.array_equal(want[k], got[k]) for k in want):
                    print(f"shard {shard}: batch {expected.state()} differs")
                    return 1
                batches += 1
                tokens += int((want["inputs"] != 0).sum() + (want["targets"] != 0).sum())
    print(
        f"{len(in_memory)} pairs, {args.epochs} epochs x {args.shards} shards: all {batches} batches equal "
        f"({tokens:,} real tokens)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
