"""End-to-end training throughput on real data: the whole `train` command, data pipeline and validation included.

    .venv/bin/python experiments/bench/train_throughput.py --data /path/to/multi30k --updates 300 \
        [--config.data.bucket_boundaries='(12,16,20,24,28,32,40,48,64,128)' ...]

Runs experiments/multi30k.py (or --config) for --updates updates in a fresh temporary workdir and reports the
real (non-pad) source + target tokens per second over the whole command (tokenizer, compiling, steps, one
validation pass at the end) and over the steps alone (the median logged window), the time to the first step, and how full the batches
were (real tokens / padded slots). Writes experiments/bench/results/train_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "train_throughput.json"


def steps_tokens_per_s(train_rows: list[dict]) -> float:
    """The median real tokens/s of the logged windows after the first (which holds the first compile): each train row's
    tokens_per_sec covers its window, validation excluded; the median leaves out the windows in which a new bucket
    shape compiled."""
    return statistics.median(row["tokens_per_sec"] for row in train_rows[1:]) if len(train_rows) > 1 else 0.0


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="the Multi30k directory (train.en, train.de, val.*, ...)")
    parser.add_argument("--config", default=str(ROOT / "experiments" / "multi30k.py"))
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    from transformer_jax import cli

    rest, extra = cli.split_overrides(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(rest)
    from transformer_jax.experiment import load_experiment
    from transformer_jax.run_log import read_rows
    from transformer_jax.train import loop

    overrides = [
        ("data.path", args.data),
        ("train.steps", str(args.updates)),
        ("train.max_minutes", "0"),
        ("train.eval_every", str(args.updates)),
        ("train.checkpoint_every", str(args.updates)),
        ("train.bleu_every", "0"),
        ("train.final_bleu", "none"),
        ("train.progress", "false"),
        ("train.log_every", "10"),
    ]
    config = load_experiment(args.config, overrides + extra)
    with tempfile.TemporaryDirectory() as workdir:
        started = time.perf_counter()
        summary = loop.train(config, workdir)
        total_s = time.perf_counter() - started
        rows = [row for row in read_rows(workdir) if row["kind"] == "train"]
    step_tokens_per_s = steps_tokens_per_s(rows)
    target_tokens = sum(row["tokens"] for row in rows)
    report = {
        "config": args.config,
        "overrides": dict(extra),
        "updates": args.updates,
        "load_average": os.getloadavg(),
        "total_s": total_s,
        "time_to_first_step_s": summary["time_to_first_step"],
        "timings": summary["timings"],
        "target_tokens": target_tokens,
        "real_target_tokens_per_s_whole_command": target_tokens / total_s,
        "real_tokens_per_s_steps": step_tokens_per_s,
        "target_tokens_per_update": target_tokens / args.updates,
        "target_slots_per_update": config.data.tokens_per_batch,
        "target_fill": target_tokens / args.updates / config.data.tokens_per_batch,
        "validation": summary["eval"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(
        f"{args.updates} updates of {Path(args.config).name}: {total_s:.0f} s in all (first step after "
        f"{summary['time_to_first_step']:.1f} s); steps: {step_tokens_per_s:,.0f} real source+target tokens/s; "
        f"whole command: {target_tokens / total_s:,.0f} real target tokens/s; batches "
        f"{report['target_fill']:.0%} full ({report['target_tokens_per_update']:,.0f} real target tokens of "
        f"{config.data.tokens_per_batch} slots)"
    )
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
