"""Validation BLEU and perplexity against wall-clock minutes, one line per training run.

    python experiments/results/plot_curves.py runs/m30k:small-d128 runs/other:label --out curves.png

Reads each workdir's metrics.jsonl: 'bleu' rows (greedy BLEU of the first validation pairs, train.bleu_every),
'eval' rows (validation perplexity) and their `elapsed_s` (seconds since the train command started).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def curves(workdir: Path) -> dict[str, list[tuple[float, float]]]:
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    out = {"bleu": [], "perplexity": []}
    for row in rows:
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
    figure, (bleu_axis, ppl_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for run in args.runs:
        directory, _, label = run.partition(":")
        data = curves(Path(directory))
        for axis, key in ((bleu_axis, "bleu"), (ppl_axis, "perplexity")):
            if data[key]:
                minutes, values = zip(*data[key])
                axis.plot(minutes, values, marker="o", label=label or directory)
    bleu_axis.set(xlabel="wall-clock minutes", ylabel="validation BLEU (greedy, 13a, cased)", title="BLEU")
    ppl_axis.set(xlabel="wall-clock minutes", ylabel="validation perplexity", yscale="log", title="perplexity")
    for axis in (bleu_axis, ppl_axis):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return args.out


if __name__ == "__main__":
    main()
