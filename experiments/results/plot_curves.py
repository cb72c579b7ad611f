"""Validation BLEU and perplexity against wall-clock minutes, one line per training run.

    python experiments/results/plot_curves.py runs/m30k:small-d128 runs/other:label --out curves.png

Reads each workdir's run log (transformer_jax/run_log.py): 'bleu' rows (greedy BLEU of the first validation pairs,
train.bleu_every), 'eval' rows (validation perplexity) and their `elapsed_s` (seconds since the train command
started).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from transformer_jax.run_log import read_rows
from transformer_jax.visualize import plot_validation_against_minutes


def curves(workdir: Path) -> dict[str, list[tuple[float, float]]]:
    """{"bleu": [(minutes, BLEU)], "perplexity": [(minutes, perplexity)]} of the run's validations."""
    out: dict[str, list[tuple[float, float]]] = {"bleu": [], "perplexity": []}
    for row in read_rows(workdir):
        if "elapsed_s" not in row:
            continue
        if row["kind"] == "bleu":
            out["bleu"].append((row["elapsed_s"] / 60, row["bleu"]))
        elif row["kind"] == "eval":
            out["perplexity"].append((row["elapsed_s"] / 60, row["perplexity"]))
    return out


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="WORKDIR or WORKDIR:label")
    parser.add_argument("--out", type=Path, default=Path("curves.png"))
    args = parser.parse_args(argv)
    runs = {}
    for run in args.runs:
        directory, _, label = run.partition(":")
        runs[label or directory] = curves(Path(directory))
    plot_validation_against_minutes(runs, args.out)
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
