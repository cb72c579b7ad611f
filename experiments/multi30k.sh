#!/usr/bin/env bash
# Multi30k end to end on a time budget: train (experiments/multi30k.py, train.max_minutes), average the 8
# checkpoints of lowest validation perplexity, then score test_2016_flickr: averaged and best checkpoint (both chosen
# on validation only), beam and greedy.
#   experiments/multi30k.sh /path/to/multi30k [workdir] [--pair en-de|de-en|en-fr] [--config.field=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: experiments/multi30k.sh /path/to/multi30k [workdir] [--pair en-de|de-en|en-fr] [--config.field=value ...]"
DATA=$(realpath "${1:?$usage}")
WORKDIR=${2:-runs/multi30k}
shift $(( $# >= 2 ? 2 : 1 ))
PAIR=en-de
if [[ "${1:-}" == "--pair" ]]; then PAIR=${2:?$usage}; shift 2; fi
case "$PAIR" in en-de|de-en|en-fr|fr-en|de-fr|fr-de) ;; *) echo "unknown --pair $PAIR; $usage" >&2; exit 2;; esac
TJ=${TJ:-.venv/bin/transformer-jax}
BEAM=${BEAM:-5}
ALPHA=${ALPHA:-1.0}  # length penalty chosen on validation (0.3 / 0.6 / 1.0: 39.8 / 40.4 / 40.7 lowercased BLEU)

SECONDS=0
"$TJ" train --config experiments/multi30k.py --workdir "$WORKDIR" --config.data.path="$DATA" \
  --config.data.source_lang="${PAIR%-*}" --config.data.target_lang="${PAIR#*-}" "$@"
TRAINED=$SECONDS
"$TJ" average --workdir "$WORKDIR" --best 8 --metric perplexity
echo "training took ${TRAINED} s; with averaging ${SECONDS} s"
for checkpoint in averaged best; do
  "$TJ" evaluate --workdir "$WORKDIR" --checkpoint "$checkpoint" --split test --batch-size 100 --beam-size "$BEAM" \
    --alpha "$ALPHA" --samples 3
  "$TJ" evaluate --workdir "$WORKDIR" --checkpoint "$checkpoint" --split test --batch-size 100 --greedy --samples 0
done
echo "all done in ${SECONDS} s"
