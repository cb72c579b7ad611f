#!/usr/bin/env bash
# The accelerator benchmark in one command (see device.py): base and big in bf16, MFU, decode speed -> JSON.
#   experiments/bench/device.sh [--smoke] [--models base,big] [--out FILE]
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
exec "$PY" experiments/bench/device.py "$@"
