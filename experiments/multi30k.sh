#!/usr/bin/env bash
# Multi30k EN→DE end to end: train, average the last 5 checkpoints, beam-decode test_2016_flickr, score.
#   experiments/multi30k.sh /path/to/multi30k [workdir] [--config.field=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=$(realpath "${1:?usage: experiments/multi30k.sh /path/to/multi30k [workdir] [--config.field=value ...]}")
WORKDIR=${2:-runs/multi30k}
shift $(( $# >= 2 ? 2 : 1 ))
TJ=${TJ:-.venv/bin/transformer-jax}

SECONDS=0
"$TJ" train --config experiments/multi30k.py --workdir "$WORKDIR" --config.data.path="$DATA" "$@"
echo "training took ${SECONDS} s"
"$TJ" average --workdir "$WORKDIR" --last 5
"$TJ" evaluate --workdir "$WORKDIR" --checkpoint averaged --split test --batch-size 100
"$TJ" evaluate --workdir "$WORKDIR" --checkpoint averaged --split test --batch-size 100 --greedy --samples 0
