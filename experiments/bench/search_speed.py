"""Greedy and beam search on real sentences with a trained model: sentences/s and beam's cost over greedy.

Each method translates the whole file once to compile (every padded width it meets), then again, timed: the
figures are warm decoding through the library's `Translator` (length-sorted batches, the §6.1 length limit of
source + 50, early termination). Run it alone on an idle machine; no numbers are asserted anywhere.

  python experiments/bench/search_speed.py --workdir runs/m30k --checkpoint averaged \\
      --source ../shared/data/multi30k/test_2016_flickr.en --beams 4,5 --alpha 1.0
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
from pathlib import Path

import jax

from transformer_jax.decoding import DecodeConfig
from transformer_jax.translate import Translator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_file import write_results  # noqa: E402


def timed_translation(translator: Translator, lines: list[str]) -> tuple[float, float]:
    """(seconds of the first, compiling pass; seconds of the second, warm pass)."""
    start = time.perf_counter()
    translator.translate(lines)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    translator.translate(lines)
    return cold, time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True, help="a trained run's --workdir")
    parser.add_argument("--checkpoint", default=None, help="a step, 'averaged', or nothing for the latest")
    parser.add_argument("--source", required=True, help="a text file, one source sentence a line")
    parser.add_argument("--lines", type=int, default=None, help="only the first N lines")
    parser.add_argument("--batch-size", type=int, default=100, help="sentences per batch (both methods)")
    parser.add_argument("--beams", default="4", help="comma-separated beam sizes")
    parser.add_argument("--alpha", type=float, default=DecodeConfig().alpha, help="length penalty of beam search")
    parser.add_argument("--out", default=None, help="JSON path (default experiments/bench/results/search_<time>.json)")
    args = parser.parse_args(argv)

    with open(args.source, encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f][: args.lines]
    base = Translator.from_workdir(args.workdir, checkpoint=args.checkpoint, batch_size=args.batch_size)
    runs = [("greedy", DecodeConfig(alpha=args.alpha))]
    runs += [(f"beam {k}", DecodeConfig(beam_size=int(k), alpha=args.alpha)) for k in args.beams.split(",")]
    rows = []
    print(f"{len(lines)} sentences, batch {args.batch_size}, alpha {args.alpha}, {jax.devices()[0].device_kind}")
    print(f"{'method':8} {'sent/s':>8} {'warm s':>7} {'cold s':>7} {'x greedy':>8}")
    for name, decode_config in runs:
        translator = Translator(
            base.model_config,
            base.params,
            base.tokenizer,
            decode_config=decode_config,
            method="greedy" if name == "greedy" else "beam",
            batch_size=args.batch_size,
        )
        cold, warm = timed_translation(translator, lines)
        row = {"method": name, "decode": dataclasses.asdict(decode_config), "cold_s": cold, "warm_s": warm}
        row["sentences_per_s"] = len(lines) / warm
        row["cost_over_greedy"] = warm / rows[0]["warm_s"] if rows else 1.0
        rows.append(row)
        print(
            f"{name:8} {row['sentences_per_s']:8.1f} {warm:7.2f} {cold:7.2f} {row['cost_over_greedy']:7.2f}x",
            flush=True,
        )

    payload = {"jax": jax.__version__, "platform": platform.platform(), "args": vars(args), "rows": rows}
    out = write_results("search", payload, args.out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
