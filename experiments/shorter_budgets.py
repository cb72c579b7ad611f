"""What shorter time budgets would have scored, read off one finished run.

    python experiments/shorter_budgets.py runs/m30k --minutes 30 40 55 70 [--best 8] [--split test]

train.max_minutes counts from the start of `train`, and the §5.3 schedule has no horizon, so a T-minute run of the
same recipe and seed trains the same first updates as a longer one (same batches, same dropout masks) and stops
at the last update before T minutes. For each budget T (and the run's own), this script takes what that run's
`transformer-jax average --best K --metric perplexity` would have taken, the K checkpoints of lowest validation
perplexity among those validated by T minutes, averages them into WORKDIR/budgets/{T}min (the run's own:
budgets/run) and scores the average like experiments/multi30k.sh (beam 5, α 1.0 by default). One difference from
a real T-minute run: that run also saves and validates the update it stops at, which is a candidate here only if
it was a checkpoint step.

WORKDIR is the run trained in one go (a resumed run's minutes restart) that still holds the chosen checkpoints:
train with --config.train.keep_best high enough to keep them all (the budgets' choices are checked before any
decoding). Prints a table; writes WORKDIR/budgets/budgets.json and budgets.png (test BLEU against the budget, and
the validation perplexity curve with each budget's averaged checkpoints).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from transformer_jax import cli, workdir
from transformer_jax.checkpoint import CHECKPOINT_DIR
from transformer_jax.errors import UsageError
from transformer_jax.machine import cpu_model
from transformer_jax.run_log import log_path, read_rows
from transformer_jax.selection import best_steps, validation_scores

BUDGETS_DIR = "budgets"


def budget_choices(rows: list[dict], budgets: dict[str, float], best: int) -> list[dict]:
    """Per budget ({name: minutes}): the last update it validated and the `best` steps of lowest perplexity among
    those validated."""
    choices = []
    for name, minutes in budgets.items():
        scores = validation_scores(rows, "perplexity", within_s=60.0 * minutes)
        if not scores:
            raise UsageError(f"--minutes {minutes:g}: the run had validated nothing by then; give a longer budget.")
        steps = best_steps(scores, scores, best, "perplexity")
        choices.append(
            {"name": name, "minutes": minutes, "last_validated": max(scores), "averaged": steps, "scores": scores}
        )
    return choices


def score_average(run: Path, choice: dict, split: str, beam_size: int, alpha: float) -> dict:
    """Averages the choice's checkpoints into run/budgets/{name} (config.json and spm.model beside them) and
    scores the average on `split` with `transformer-jax evaluate`; returns the evaluation's JSON."""
    target = run / BUDGETS_DIR / choice["name"]
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name in (workdir.CONFIG_FILENAME, "spm.model"):
        shutil.copy2(run / name, target / name)
    workdir.save_named_params(
        target, "averaged", workdir.average_params(run, steps=choice["averaged"]), choice["averaged"]
    )
    argv = ["evaluate", "--workdir", str(target), "--checkpoint", "averaged", "--split", split, "--batch-size", "100"]
    if cli.main(argv + ["--beam-size", str(beam_size), "--alpha", str(alpha), "--samples", "0"]) != 0:
        raise RuntimeError(f"evaluating {target} failed (see above)")
    (evaluation,) = (target / "eval").glob("*.json")
    return json.loads(evaluation.read_text())


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    budgets = report["budgets"]
    left.plot([b["minutes"] for b in budgets], [b["bleu_lowercase"] for b in budgets], "o-")
    left.set(xlabel="budget (minutes)", ylabel=f"{report['split']} BLEU (lowercased)", title="average of the best")
    curve = sorted(report["validation_perplexity"].items(), key=lambda item: int(item[0]))
    right.plot([int(step) for step, _ in curve], [value for _, value in curve], color="grey", lw=1)
    for budget in budgets:
        chosen = budget["averaged"]
        right.plot(
            chosen,
            [report["validation_perplexity"][str(step)] for step in chosen],
            ".",
            ms=8,
            label=f"{budget['minutes']:g} min",
        )
    right.set(
        xlabel="update",
        ylabel="validation perplexity",
        title="the checkpoints each budget averages",
        ylim=(min(v for _, v in curve) * 0.97, min(v for _, v in curve) * 1.6),
    )
    right.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdir", type=Path, help="a finished `transformer-jax train` run that kept its checkpoints")
    parser.add_argument("--minutes", type=float, nargs="+", required=True, help="the shorter budgets to replay")
    parser.add_argument("--best", type=int, default=8, help="checkpoints averaged (multi30k.sh: 8)")
    parser.add_argument("--split", default="test", help="the split scored (default test)")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=1.0)
    args = parser.parse_args(argv)

    run = args.workdir
    rows = read_rows(run)
    if not rows:
        raise UsageError(f"{log_path(run)} is missing or empty: give the workdir of a finished train run.")
    if not (run / CHECKPOINT_DIR).is_dir():
        raise UsageError(f"{run / CHECKPOINT_DIR} not found: give a train run that kept its checkpoints.")
    full = max(row["elapsed_s"] for row in rows) / 60.0
    too_long = [m for m in args.minutes if m >= full]
    if too_long:
        raise UsageError(f"--minutes {too_long}: the run lasted {full:.1f} minutes; give shorter budgets.")
    named = {f"{minutes:g}min": minutes for minutes in sorted(args.minutes)} | {"run": full}
    choices = budget_choices(rows, named, args.best)
    missing = sorted({step for choice in choices for step in choice["averaged"]} - set(workdir.kept_steps(run)))
    if missing:
        raise UsageError(
            f"{run / CHECKPOINT_DIR} lacks checkpoints {missing} that these budgets average: train with "
            "--config.train.keep_best high enough to keep every checkpoint, or give longer budgets."
        )

    budgets = []
    for choice in choices:
        scores = score_average(run, choice, args.split, args.beam_size, args.alpha)
        budgets.append(
            {
                "minutes": round(choice["minutes"], 2),
                "last_validated": choice["last_validated"],
                "averaged": choice["averaged"],
                "best_validation_perplexity": min(choice["scores"].values()),
                **{key: scores[key] for key in ("bleu", "bleu_lowercase", "chrf", "bleu_moses_lowercase")},
            }
        )
    report = {
        "workdir": str(run),
        "cpu": cpu_model(),
        "split": args.split,
        "decoding": f"beam {args.beam_size}, alpha {args.alpha}",
        "best": args.best,
        "budgets": budgets,
        "validation_perplexity": {str(step): value for step, value in validation_scores(rows, "perplexity").items()},
    }
    out = run / BUDGETS_DIR
    (out / "budgets.json").write_text(json.dumps(report, indent=2))
    plot(report, out / "budgets.png")
    print(f"\n{run}: the average of the best {args.best} by validation perplexity, {report['decoding']}, {args.split}")
    print("| budget (min) | validated to update | averaged | best val. PPL | BLEU lc | BLEU | chrF |")
    print("|---|---|---|---|---|---|---|")
    for b in budgets:
        span = f"{b['averaged'][0]}–{b['averaged'][-1]}"
        print(
            f"| {b['minutes']:g} | {b['last_validated']:,} | {span} | {b['best_validation_perplexity']:.2f} | "
            f"{b['bleu_lowercase']:.2f} | {b['bleu']:.2f} | {b['chrf']:.2f} |"
        )
    print(f"wrote {out / 'budgets.json'} and {out / 'budgets.png'}")
    return report


if __name__ == "__main__":
    try:
        main()
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
