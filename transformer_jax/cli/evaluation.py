"""Judging a trained workdir: `evaluate` (a split or a file, translated and scored), `average` (checkpoints' parameters
averaged, for `--checkpoint averaged`)."""

from __future__ import annotations

import argparse
import time
import typing
from pathlib import Path

from transformer_jax.cli.command import Command
from transformer_jax.cli.inference import add_decoding_arguments, decoding_method, translator_from_args
from transformer_jax.errors import ArgumentError, UsageError
from transformer_jax.selection import BestMetric

# ------------------------------------------------------------------------------------------------- evaluate


def _declare_evaluate(parser: argparse.ArgumentParser) -> None:
    add_decoding_arguments(parser)
    parser.add_argument("--split", default="test", help="split of the run's data source (train/validation/test)")
    parser.add_argument("--source-file", help="score these source lines instead of a split (needs --reference-file)")
    parser.add_argument("--reference-file", help="raw reference translations, one per line")
    parser.add_argument("--samples", type=int, default=5, help="sample translations to print")


def _evaluation_pairs(args: argparse.Namespace) -> tuple[str, list[tuple[str, str]]]:
    """(name, raw pairs): from --source-file/--reference-file, else the split of the run's own data source."""
    from transformer_jax.data.local_files import read_lines

    if bool(args.source_file) != bool(args.reference_file):
        raise UsageError("--source-file and --reference-file go together.")
    if args.source_file:
        sources = list(read_lines(Path(args.source_file)))
        references = list(read_lines(Path(args.reference_file)))
        if len(sources) != len(references):
            raise UsageError(
                f"{args.source_file} has {len(sources)} lines but {args.reference_file} has "
                f"{len(references)}; they must pair up line by line."
            )
        return Path(args.source_file).stem, list(zip(sources, references))
    from transformer_jax import workdir
    from transformer_jax.data.pairs import SPLITS
    from transformer_jax.data.sources import source_from_config
    from transformer_jax.experiment import Experiment

    if args.split not in SPLITS:
        raise ArgumentError(
            f"--split {args.split}: a run's data source has the splits {', '.join(SPLITS)}; for other files give "
            "--source-file and --reference-file."
        )
    data = Experiment.from_dict(workdir.load_config(args.workdir)).data
    return args.split, list(source_from_config(data, splits=(args.split,)).pairs(args.split))


def _run_evaluate(args: argparse.Namespace) -> None:
    from transformer_jax import workdir
    from transformer_jax.evaluation import evaluate_pairs, save_evaluation

    workdir.check_workdir(args.workdir)  # eval/ is written after decoding: fail now, not then
    name, pairs = _evaluation_pairs(args)
    if not pairs:
        raise UsageError(f"nothing to score: {name} has no sentence pairs (empty files?).")
    translator = translator_from_args(args)
    method = {
        "greedy": "greedy",
        "beam": f"beam{args.beam_size}-alpha{args.alpha}",
        "sample": f"sample-t{args.temperature}-k{args.top_k}-p{args.top_p}-seed{args.seed}",
    }[decoding_method(args)] + (f"-ensemble{1 + len(args.ensemble)}" if args.ensemble else "")
    started = time.perf_counter()
    target_lang = workdir.load_config(args.workdir)["data"].get("target_lang")
    evaluation = evaluate_pairs(translator, pairs, progress=True, moses_lang=target_lang)
    seconds = time.perf_counter() - started
    label = f"{name}.{args.checkpoint or 'latest'}.{method}"
    saved = save_evaluation(
        args.workdir,
        label,
        evaluation,
        split=name,
        checkpoint=args.checkpoint or "latest",
        method=method,
        seconds=seconds,
        sentences_per_sec=len(pairs) / seconds,
    )
    print(evaluation.samples(args.samples))
    print(f"{name} ({args.checkpoint or 'latest'} checkpoint, {method}): {evaluation.scores.summary()}")
    print(
        f"decoded {len(pairs)} sentences in {seconds:.1f} s ({len(pairs) / seconds:.1f} sentences/s); "
        f"hypotheses and scores in {saved.with_suffix('')}.*"
    )


# -------------------------------------------------------------------------------------------------- average


def _declare_average(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", required=True)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--last", type=int, default=5, help="how many of the latest checkpoints (default 5)")
    which.add_argument("--best", type=int, default=None, help="how many of the kept checkpoints best on validation")
    parser.add_argument(
        "--metric",
        choices=typing.get_args(BestMetric),
        default=None,
        help="with --best: validation perplexity or greedy BLEU (default: the run's train.best_metric)",
    )
    parser.add_argument(
        "--from-fraction",
        type=float,
        default=0.0,
        help="with --last: only checkpoints at or after this fraction of the latest step (0.5: the second half)",
    )


def _run_average(args: argparse.Namespace) -> None:
    """The counts and the fraction are workdir.average_last's / average_best's to check (ArgumentError, exit 2)."""
    from transformer_jax import workdir

    workdir.check_workdir(args.workdir)
    if args.best is not None:
        metric = args.metric or workdir.run_best_metric(args.workdir)
        steps, directory = workdir.average_best(args.workdir, args.best, metric)
        chosen = f"the {len(steps)} best by validation {metric}"
    else:
        steps, directory = workdir.average_last(args.workdir, args.last, from_fraction=args.from_fraction)
        chosen = "the latest"
    print(f"averaged checkpoints {steps} ({chosen}) into {directory}; use it with --checkpoint averaged")


COMMANDS = (
    Command(
        "evaluate",
        help="Translate a split (or a file) and score it with sacreBLEU (13a, cased) and chrF.",
        declare=_declare_evaluate,
        run=_run_evaluate,
        examples=(
            "transformer-jax evaluate --workdir runs/tiny --checkpoint averaged --split test",
            "transformer-jax evaluate --workdir runs/tiny --greedy --source-file in.en --reference-file ref.de",
        ),
    ),
    Command(
        "average",
        help="Average the parameters of the last N checkpoints (paper §6.1: 5 for base, 20 for big), or of the N "
        "best by a validation metric.",
        declare=_declare_average,
        run=_run_average,
        examples=(
            "transformer-jax average --workdir runs/tiny --last 5   # then --checkpoint averaged",
            "transformer-jax average --workdir runs/m30k --best 8 --metric perplexity",
        ),
    ),
)
