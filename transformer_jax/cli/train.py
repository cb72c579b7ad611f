"""`train` (one experiment in a workdir) and `sweep` (a workdir per row of a sweep file, then one table)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from transformer_jax.cli.command import Command, Stopped
from transformer_jax.errors import UsageError


def _declare_train(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        help="experiment file with get_config(), e.g. experiments/tiny.py (default: the workdir's config.json, e.g. "
        "of a model imported with import-hf, to fine-tune or resume)",
    )
    parser.add_argument("--workdir", required=True, help="run directory; an existing one is resumed")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def _run_train(args: argparse.Namespace) -> None:
    from transformer_jax.experiment import load_experiment
    from transformer_jax.train import loop
    from transformer_jax.workdir import CONFIG_FILENAME, check_workdir

    config = args.config or Path(args.workdir) / CONFIG_FILENAME
    if not Path(config).is_file():
        raise UsageError(f"--workdir {args.workdir} has no {CONFIG_FILENAME}: give --config, e.g. experiments/tiny.py.")
    experiment = load_experiment(config, args.config_overrides)
    if args.print_config:
        print(json.dumps(experiment.to_dict(), indent=2))
        return
    check_workdir(args.workdir)
    try:
        summary = loop.train(experiment, args.workdir)
    except KeyboardInterrupt:
        print("interrupted before training started; nothing was saved or changed.", file=sys.stderr)
        raise Stopped("SIGINT") from None
    eval_metrics, interrupted = summary.get("eval") or {}, summary.get("interrupted")
    line = f"done: update {summary['step']}"
    if eval_metrics:
        line += f", validation NLL {eval_metrics['nll']:.4f} (perplexity {eval_metrics['perplexity']:.2f})"
    if summary.get("final_bleu"):
        line += f", validation BLEU {summary['final_bleu']['bleu']:.2f} ({experiment.train.final_bleu})"
    if interrupted:
        line += f"; stopped by {interrupted}, rerun the same command to resume"
    if summary.get("stopped_by"):
        line += f"; stopped by the {summary['stopped_by']}"
    print(line + f"; workdir {args.workdir}")
    if interrupted:
        raise Stopped(interrupted)  # a script running us must stop too


def _declare_sweep(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", metavar="SWEEP_FILE", help="a Python file with get_sweep(), e.g. experiments/table3.py"
    )
    parser.add_argument("--workdir", required=True, help="a workdir per row under it, and table.md/.csv/.json/.png")
    parser.add_argument(
        "--rows",
        help="comma-separated row names or workdir names to run or print commands for (default: every row); the table "
        "has every row",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print each row's `transformer-jax train` command")
    mode.add_argument("--collect", action="store_true", help="only build the table from the row workdirs as they are")


def _run_sweep(args: argparse.Namespace) -> None:
    from transformer_jax import sweep
    from transformer_jax.workdir import check_workdir

    the_sweep, config, planned = sweep.plan(args.config, args.workdir, args.config_overrides)
    chosen = sweep.select(planned, args.rows)

    def write_table() -> tuple[Path, int]:  # every row of the sweep, whichever were chosen; and how many unfinished
        results = [sweep.row_result(row) for row in planned]
        return sweep.write_table(the_sweep, planned, results, Path(args.workdir)), results.count(None)

    if args.dry_run:
        for row in chosen:
            print(sweep.train_command(config, row))
        return
    if not args.collect:
        check_workdir(args.workdir)
        try:
            sweep.run(chosen, after_row=write_table)
        except sweep.RowInterrupted as stop:
            table, _ = write_table()
            print(f"{stop}; the table ({table}) has the rows finished so far; rerun the same command to resume.")
            raise Stopped(stop.signal_name) from None
        except KeyboardInterrupt:  # before a row's training had started (it catches its own signals)
            print("interrupted before a row's training started; rerun the same command to resume.", file=sys.stderr)
            raise Stopped("SIGINT") from None
    table, missing = write_table()
    print(table.read_text())
    print(f"wrote {table} (and .csv, .json, .png)" + (f"; {missing} rows not finished" if missing else ""))


COMMANDS = (
    Command(
        "train",
        help="Train (or resume) an experiment in a workdir.",
        declare=_declare_train,
        run=_run_train,
        note="Override any config field with --config.section.field=value, e.g. --config.train.steps=100.",
        examples=(
            "transformer-jax train --config experiments/tiny.py --workdir runs/tiny",
            "transformer-jax train --config experiments/multi30k.py --workdir runs/m30k "
            "--config.data.path=data/multi30k --config.train.max_minutes=60",
            "transformer-jax train --config runs/tiny/config.json --workdir runs/tiny  # replay, resume",
            "transformer-jax train --workdir runs/opus-en-de --config.train.steps=2000  # fine-tune an import-hf model",
        ),
    ),
    Command(
        "sweep",
        help="Train each row of a sweep file in its own workdir, then write one table of the results.",
        declare=_declare_sweep,
        run=_run_sweep,
        note="Override any config field of every row with --config.section.field=value.",
        examples=(
            "transformer-jax sweep experiments/table3.py --workdir runs/table3 --config.data.path=data/multi30k",
            "transformer-jax sweep experiments/table3.py --workdir runs/table3 --dry-run   # one job per row",
            "transformer-jax sweep experiments/table3.py --workdir runs/table3 --collect",
        ),
    ),
)
