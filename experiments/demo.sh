#!/usr/bin/env bash
# `make demo`: the main job end to end, offline: train the tiny config on the built-in EN→DE corpus, average
# the last checkpoints (paper §6.1), beam-decode the corpus's held-out test split, print BLEU/chrF and samples.
set -euo pipefail
cd "$(dirname "$0")/.."
WORKDIR=${WORKDIR:-runs/demo}
TJ=${TJ:-.venv/bin/transformer-jax}

"$TJ" train --config experiments/tiny.py --workdir "$WORKDIR"
"$TJ" average --workdir "$WORKDIR" --last 3
"$TJ" evaluate --workdir "$WORKDIR" --checkpoint averaged --split test --batch-size 64 --samples 6
echo "curves: $WORKDIR/curves.png   TensorBoard: tensorboard --logdir $WORKDIR/tensorboard (pip install '.[tensorboard]')"
