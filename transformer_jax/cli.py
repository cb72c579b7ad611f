"""`transformer-jax <command>`: train now; translate / evaluate / average register themselves the same way.

Adding a command:

    @register("translate", help="Translate text with a trained workdir.")
    def translate_command(parser):          # called once to declare the arguments
        parser.add_argument("--workdir", required=True)
        return run_translate                # run_translate(args) -> exit code (or None = 0)

Config overrides (`--config.section.field=value`) are collected for every command that declares
`--config` and applied with `transformer_jax.experiment.apply_overrides` (parsed by each field's type; unknown
fields are errors).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from transformer_jax.errors import UsageError, UserError

Handler = Callable[[argparse.Namespace], "int | None"]
Declare = Callable[[argparse.ArgumentParser], Handler]


class _Command:
    def __init__(self, name: str, help: str, declare: Declare):
        self.name, self.help, self.declare = name, help, declare


COMMANDS: dict[str, _Command] = {}
OVERRIDE = re.compile(r"^--config\.([A-Za-z_][\w.]*)(?:=(.*))?$", re.DOTALL)


def register(name: str, help: str) -> Callable[[Declare], Declare]:
    """Decorator: `declare(parser) -> handler` adds the arguments of command `name` and returns its handler."""

    def decorator(declare: Declare) -> Declare:
        if name in COMMANDS:
            raise ValueError(f"command {name!r} is registered twice.")
        COMMANDS[name] = _Command(name, help, declare)
        return declare

    return decorator


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Separates `--config.a.b=v` / `--config.a.b v` from the other arguments."""
    rest, overrides, index = [], [], 0
    argv = list(argv)
    while index < len(argv):
        match = OVERRIDE.match(argv[index])
        if match:
            value = match.group(2)
            if value is None:
                if index + 1 >= len(argv):
                    raise SystemExit(f"error: {argv[index]} needs a value: {argv[index]}=VALUE")
                index += 1
                value = argv[index]
            overrides.append((match.group(1), value))
        else:
            rest.append(argv[index])
        index += 1
    return rest, overrides


def load_experiment(path: str, overrides: Sequence[tuple[str, str]] = ()):
    """The Experiment of a config file (or a workdir's config.json) with command-line overrides applied."""
    from transformer_jax import experiment

    return experiment.load_experiment(path, overrides)


# ---------------------------------------------------------------------------------------------- train


@register("train", help="Train (or resume) an experiment in a workdir.")
def _train_command(parser: argparse.ArgumentParser) -> Handler:
    parser.add_argument("--config", required=True, help="experiment file with get_config(), e.g. experiments/tiny.py")
    parser.add_argument("--workdir", required=True, help="run directory; an existing one is resumed")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.epilog = (
        "Override any config field with --config.section.field=value, e.g. --config.train.steps=100.\n"
        "examples:\n"
        "  transformer-jax train --config experiments/tiny.py --workdir runs/tiny\n"
        "  transformer-jax train --config experiments/multi30k.py --workdir runs/m30k "
        "--config.data.path=data/multi30k --config.train.max_minutes=60\n"
        "  transformer-jax train --config runs/tiny/config.json --workdir runs/tiny  # replay, resume"
    )
    return _run_train


def _run_train(args: argparse.Namespace) -> int:
    from transformer_jax.train import loop

    experiment = load_experiment(args.config, args.config_overrides)
    if args.print_config:
        print(json.dumps(experiment.to_dict(), indent=2))
        return 0
    check_workdir(args.workdir, writable=True)
    try:
        summary = loop.train(experiment, args.workdir)
    except KeyboardInterrupt:
        print("interrupted before training started; nothing was saved or changed.", file=sys.stderr)
        return 130
    eval_metrics = summary.get("eval") or {}
    line = f"done: update {summary['step']}"
    if eval_metrics:
        line += f", validation NLL {eval_metrics['nll']:.4f} (perplexity {eval_metrics['perplexity']:.2f})"
    if summary.get("final_bleu"):
        line += f", validation BLEU {summary['final_bleu']['bleu']:.2f} ({experiment.train.final_bleu})"
    if summary.get("interrupted"):
        line += f"; stopped by {summary['interrupted']}, rerun the same command to resume"
    if summary.get("stopped_by"):
        line += f"; stopped by the {summary['stopped_by']}"
    print(line + f"; workdir {args.workdir}")
    return SIGNAL_EXIT_CODES.get(summary.get("interrupted") or "", 0)  # a script running us must stop too


# 128 + the signal number, as shells report a process a signal stopped.
SIGNAL_EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}


def check_workdir(workdir: str, *, writable: bool) -> None:
    """Fails at once (OSError with the fix) on a remote URL, a path that is a file, or one we cannot write."""
    if "://" in str(workdir):
        raise OSError(
            f"--workdir {workdir}: remote paths are not supported; use a local directory (e.g. a "
            f"mounted bucket) and copy the results."
        )
    path = Path(workdir)
    if path.exists() and not path.is_dir():
        raise OSError(f"--workdir {workdir} is a file, not a directory; pass a directory.")
    if writable:
        existing = path if path.exists() else next(parent for parent in path.absolute().parents if parent.exists())
        if not os.access(existing, os.W_OK | os.X_OK):
            raise OSError(
                f"--workdir {workdir}: {existing} is not writable; fix its permissions or choose "
                f"another directory. Nothing was written."
            )


# ------------------------------------------------------------------------- translate / evaluate / average


CHECKPOINT_HELP = (
    "a step number, 'latest' (the default), 'best' (the best on validation, train.best_metric), 'averaged' (see "
    "`average`) or 'imported' (see `import-torch`)"
)


def _add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    from transformer_jax.decoding import DecodeConfig

    parser.add_argument("--workdir", required=True, help="the --workdir of a `transformer-jax train` run")
    parser.add_argument("--checkpoint", default=None, help=CHECKPOINT_HELP)
    parser.add_argument("--greedy", action="store_true", help="greedy decoding instead of beam search")
    for field in dataclasses.fields(DecodeConfig):  # --beam-size, --alpha, ...: one flag per DecodeConfig field
        kind = type(field.default) if field.default is not None else int
        parser.add_argument(
            f"--{field.name.replace('_', '-')}", type=kind, default=field.default, help=field.metadata.get("help")
        )
    parser.add_argument("--batch-size", type=int, default=32, help="sentences decoded together")


def _translator(args: argparse.Namespace, **options):
    """The Translator the decoding arguments describe (--workdir, --checkpoint, --greedy, --beam-size, ...)."""
    from transformer_jax.decoding import DecodeConfig
    from transformer_jax.translate import Translator

    fields = dataclasses.fields(DecodeConfig)
    decode_config = DecodeConfig(**{field.name: getattr(args, field.name) for field in fields})
    return Translator.from_workdir(
        args.workdir,
        args.checkpoint,
        decode_config=decode_config,
        method="greedy" if args.greedy else "beam",
        batch_size=args.batch_size,
        **options,
    )


@register("translate", help="Translate text line by line with a trained workdir (stdin/stdout by default).")
def _translate_command(parser: argparse.ArgumentParser) -> Handler:
    _add_decoding_arguments(parser)
    parser.add_argument("--input", help="read source lines from this file (default: stdin)")
    parser.add_argument("--output", help="write translations to this file (default: stdout)")
    parser.add_argument("--nbest", type=int, default=1, help="hypotheses per line, best first (at most the beam)")
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="batch by padded source tokens instead of --batch-size sentences"
    )
    parser.add_argument(
        "--format",
        choices=("text", "tsv", "jsonl"),
        default="text",
        help="text: the best translation per line; tsv: line, rank, score, translation per "
        "hypothesis; jsonl: {source, hypotheses: [{text, score}]} per line",
    )
    parser.add_argument(
        "--on-too-long",
        choices=("truncate", "error"),
        default="truncate",
        help="an input longer than the model's max_len: truncate with a warning, or stop",
    )
    parser.add_argument("--chunk-lines", type=int, default=1000, help="lines read before a chunk is decoded")
    parser.epilog = (
        "examples:\n"
        "  transformer-jax translate --workdir runs/tiny --checkpoint averaged < in.en > out.de\n"
        "  transformer-jax translate --workdir runs/tiny --input in.en --nbest 4 --format jsonl"
    )
    return _run_translate


def _utf8_lines(stream):
    """Lines of a binary (or text) stream, decoded one at a time: bad bytes stop at their own line, so the lines
    before them are still translated (a text stream would fail on the whole buffer it decodes at once)."""
    for line in stream:
        yield line.decode("utf-8").rstrip("\r\n") if isinstance(line, bytes) else line.rstrip("\r\n")


def _format_translation(number: int, source: str, hypotheses, fmt: str) -> str:
    if fmt == "text":
        return hypotheses[0].text + "\n"
    if fmt == "tsv":
        return "".join(f"{number}\t{rank}\t{h.score:.4f}\t{h.text}\n" for rank, h in enumerate(hypotheses, 1))
    return (
        json.dumps(
            {"source": source, "hypotheses": [{"text": h.text, "score": h.score} for h in hypotheses]},
            ensure_ascii=False,
        )
        + "\n"
    )


def _run_translate(args: argparse.Namespace) -> int:
    if args.nbest > 1 and args.format == "text":
        args.format = "tsv"  # several hypotheses need their rank and score
    number = 0
    try:
        translator = _translator(args, on_too_long=args.on_too_long, max_tokens=args.max_tokens)
        with contextlib.ExitStack() as files:
            source = (
                files.enter_context(open(args.input, "rb")) if args.input else getattr(sys.stdin, "buffer", sys.stdin)
            )
            sink = files.enter_context(open(args.output, "w", encoding="utf-8")) if args.output else sys.stdout
            stream = translator.translate_stream(
                _utf8_lines(source), chunk_lines=args.chunk_lines, nbest=args.nbest, progress=True
            )
            for number, (line, hypotheses) in enumerate(stream, start=1):
                sink.write(_format_translation(number, line, hypotheses, args.format))
                sink.flush()
    except UnicodeDecodeError as error:
        print(
            f"error: input line {number + 1} is not UTF-8 ({error.reason} at byte {error.start}); the "
            f"{number} lines before it were translated. Convert the input, e.g. "
            f"iconv -f LATIN1 -t UTF-8 FILE.",
            file=sys.stderr,
        )
        return 1
    except BrokenPipeError:  # the reader went away (e.g. `| head -1`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0


@register("evaluate", help="Translate a split (or a file) and score it with sacreBLEU (13a, cased) and chrF.")
def _evaluate_command(parser: argparse.ArgumentParser) -> Handler:
    _add_decoding_arguments(parser)
    parser.add_argument("--split", default="test", help="split of the run's data source (train/validation/test)")
    parser.add_argument("--source-file", help="score these source lines instead of a split (needs --reference-file)")
    parser.add_argument("--reference-file", help="raw reference translations, one per line")
    parser.add_argument("--samples", type=int, default=5, help="sample translations to print")
    return _run_evaluate


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
    from transformer_jax.data.sources import source_from_config
    from transformer_jax.experiment import Experiment

    data = Experiment.from_dict(workdir.load_config(args.workdir)).data
    return args.split, list(source_from_config(data, splits=(args.split,)).pairs(args.split))


def _run_evaluate(args: argparse.Namespace) -> int:
    from transformer_jax import workdir
    from transformer_jax.evaluation import evaluate_pairs, save_evaluation

    check_workdir(args.workdir, writable=True)  # eval/ is written after decoding: fail now, not then
    name, pairs = _evaluation_pairs(args)
    if not pairs:
        raise UsageError(f"nothing to score: {name} has no sentence pairs (empty files?).")
    translator = _translator(args)
    method = "greedy" if args.greedy else f"beam{args.beam_size}-alpha{args.alpha}"
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
    return 0


@register("sweep", help="Train each row of a sweep file in its own workdir, then write one table of the results.")
def _sweep_command(parser: argparse.ArgumentParser) -> Handler:
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
    parser.epilog = (
        "Override any config field of every row with --config.section.field=value.\n"
        "examples:\n"
        "  transformer-jax sweep experiments/table3.py --workdir runs/table3 --config.data.path=data/multi30k\n"
        "  transformer-jax sweep experiments/table3.py --workdir runs/table3 --dry-run   # one job per row\n"
        "  transformer-jax sweep experiments/table3.py --workdir runs/table3 --collect"
    )
    return _run_sweep


def _run_sweep(args: argparse.Namespace) -> int:
    from transformer_jax import sweep

    the_sweep, config, planned = sweep.plan(args.config, args.workdir, args.config_overrides)
    chosen = sweep.select(planned, args.rows)

    def write_table() -> tuple[Path, int]:  # every row of the sweep, whichever were chosen; and how many unfinished
        results = [sweep.row_result(row) for row in planned]
        return sweep.write_table(the_sweep, planned, results, Path(args.workdir)), results.count(None)

    if args.dry_run:
        for row in chosen:
            print(sweep.train_command(config, row))
        return 0
    if not args.collect:
        check_workdir(args.workdir, writable=True)
        try:
            sweep.run(chosen, after_row=write_table)
        except sweep.RowInterrupted as stop:
            table, _ = write_table()
            print(f"{stop}; the table ({table}) has the rows finished so far; rerun the same command to resume.")
            return SIGNAL_EXIT_CODES[stop.signal_name]
        except KeyboardInterrupt:  # before a row's training had started (it catches its own signals)
            print("interrupted before a row's training started; rerun the same command to resume.", file=sys.stderr)
            return SIGNAL_EXIT_CODES["SIGINT"]
    table, missing = write_table()
    print(table.read_text())
    print(f"wrote {table} (and .csv, .json, .png)" + (f"; {missing} rows not finished" if missing else ""))
    return 0


@register(
    "average",
    help="Average the parameters of the last N checkpoints (paper §6.1: 5 for base, 20 for big), or of the N best "
    "by a validation metric.",
)
def _average_command(parser: argparse.ArgumentParser) -> Handler:
    parser.add_argument("--workdir", required=True)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--last", type=int, default=5, help="how many of the latest checkpoints (default 5)")
    which.add_argument("--best", type=int, default=None, help="how many of the kept checkpoints best on validation")
    parser.add_argument(
        "--metric",
        choices=("perplexity", "bleu"),  # selection.BEST_METRICS (not imported: the CLI starts light)
        default=None,
        help="with --best: validation perplexity or greedy BLEU (default: the run's train.best_metric)",
    )
    parser.add_argument(
        "--from-fraction",
        type=float,
        default=0.0,
        help="with --last: only checkpoints at or after this fraction of the latest step (0.5: the second half)",
    )
    return _run_average


def _run_average(args: argparse.Namespace) -> int:
    from transformer_jax import workdir

    count, flag = (args.best, "--best") if args.best is not None else (args.last, "--last")
    if count < 1:
        print(f"error: {flag} {count}: give how many checkpoints to average (1 or more).", file=sys.stderr)
        return 2
    if not 0.0 <= args.from_fraction <= 1.0:
        print(f"error: --from-fraction {args.from_fraction}: give a fraction of the run in [0, 1].", file=sys.stderr)
        return 2
    check_workdir(args.workdir, writable=True)
    if args.best is not None:
        metric = args.metric or workdir.run_best_metric(args.workdir)
        steps, directory = workdir.average_best(args.workdir, args.best, metric)
        chosen = f"the {len(steps)} best by validation {metric}"
    else:
        steps, directory = workdir.average_last(args.workdir, args.last, from_fraction=args.from_fraction)
        chosen = "the latest"
    print(f"averaged checkpoints {steps} ({chosen}) into {directory}; use it with --checkpoint averaged")
    return 0


# --------------------------------------------------------------------------------- PyTorch interop


@register("export-torch", help="Write a checkpoint's parameters as a torch state_dict file (needs torch).")
def _export_torch_command(parser: argparse.ArgumentParser) -> Handler:
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--checkpoint", default=None, help=CHECKPOINT_HELP)
    parser.add_argument("--output", required=True, help="path of the .pt file to write")
    return _run_export_torch


def _run_export_torch(args: argparse.Namespace) -> int:
    from transformer_jax import workdir
    from transformer_jax.interop import export_torch_state_dict

    model_config, params, _ = workdir.load_model_for_inference(args.workdir, args.checkpoint)
    export_torch_state_dict(params, model_config, args.output)
    print(f"wrote {args.output}: load it into transformer_jax.interop.torch.TorchTransformer(config)")
    return 0


@register("export-ctranslate2", help="Write a checkpoint as a CTranslate2 model directory (needs ctranslate2).")
def _export_ctranslate2_command(parser: argparse.ArgumentParser) -> Handler:
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--checkpoint", default=None, help=CHECKPOINT_HELP)
    parser.add_argument("--output", required=True, help="the model directory to write (new or empty)")
    parser.add_argument("--quantization", default=None, help="weight type, e.g. int8 or float16 (default float32)")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --output")
    return _run_export_ctranslate2


def _run_export_ctranslate2(args: argparse.Namespace) -> int:
    from transformer_jax import workdir
    from transformer_jax.interop.ctranslate2 import (
        QUANTIZATIONS,
        check_expressible,
        check_output_dir,
        export_ctranslate2,
    )

    if args.quantization not in (None, *QUANTIZATIONS):
        raise UsageError(f"--quantization {args.quantization} is unknown; use one of {', '.join(QUANTIZATIONS)}.")
    check_output_dir(args.output, force=args.force)  # before loading anything
    check_expressible(workdir.model_config_from_workdir(args.workdir))
    model_config, params, tokenizer = workdir.load_model_for_inference(args.workdir, args.checkpoint)
    export_ctranslate2(params, model_config, tokenizer, args.output, quantization=args.quantization, force=args.force)
    print(
        f"wrote {args.output}: load it with ctranslate2.Translator({args.output!r}) and translate SentencePiece pieces"
    )
    return 0


@register("import-torch", help="Load a torch state_dict file into a workdir as --checkpoint imported.")
def _import_torch_command(parser: argparse.ArgumentParser) -> Handler:
    parser.add_argument("--workdir", required=True, help="a workdir whose config.json describes the model")
    parser.add_argument("--input", required=True, help="the .pt state_dict file")
    return _run_import_torch


def _run_import_torch(args: argparse.Namespace) -> int:
    from transformer_jax import workdir
    from transformer_jax.interop import import_torch_state_dict

    check_workdir(args.workdir, writable=True)
    model_config = workdir.model_config_from_workdir(args.workdir)
    params = import_torch_state_dict(args.input, model_config)
    directory = workdir.save_named_params(args.workdir, "imported", params, steps=[])
    print(f"imported {args.input} into {directory}; use it with --checkpoint imported")
    return 0


# ---------------------------------------------------------------------------------------------- main


def _version() -> str:
    from transformer_jax import __version__

    return __version__


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    parser = argparse.ArgumentParser(prog="transformer-jax", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument(
        "--compilation-cache",
        metavar="DIR|off",
        default=None,
        help="persistent XLA compilation cache: a second run of the same config skips compiling "
        "(default: $TRANSFORMER_JAX_COMPILATION_CACHE or ~/.cache/transformer_jax/xla)",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    handlers = {}
    for name, command in COMMANDS.items():
        sub = subparsers.add_parser(
            name, help=command.help, description=command.help, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        handlers[name] = command.declare(sub)
        sub.epilog = sub.epilog or EXAMPLES.get(name)
    return parser, handlers


EXAMPLES = {
    "evaluate": "examples:\n"
    "  transformer-jax evaluate --workdir runs/tiny --checkpoint averaged --split test\n"
    "  transformer-jax evaluate --workdir runs/tiny --greedy --source-file in.en --reference-file ref.de",
    "average": "examples:\n  transformer-jax average --workdir runs/tiny --last 5   # then --checkpoint averaged\n"
    "  transformer-jax average --workdir runs/m30k --best 8 --metric perplexity",
    "export-torch": "examples:\n"
    "  transformer-jax export-torch --workdir runs/tiny --checkpoint averaged --output model.pt",
    "import-torch": "examples:\n  transformer-jax import-torch --workdir runs/tiny --input model.pt",
    "export-ctranslate2": "examples:\n"
    "  transformer-jax export-ctranslate2 --workdir runs/tiny --checkpoint averaged --output ct2 --quantization int8",
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        rest, overrides = split_overrides(argv)
    except SystemExit as error:
        print(error, file=sys.stderr)
        return 2
    parser, handlers = build_parser()
    args = parser.parse_args(rest)
    args.config_overrides = overrides
    if overrides and not hasattr(args, "config"):
        parser.error(f"{args.command} takes no --config overrides")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from transformer_jax.compilation_cache import enable_compilation_cache

    enable_compilation_cache(args.compilation_cache)
    return run_handler(handlers[args.command], args)


BUG_EXIT_CODE = 70  # EX_SOFTWARE (sysexits.h): an internal error


def run_handler(handler: Handler, args: argparse.Namespace) -> int:
    """Runs a command. A mistake the user can fix (`errors.UserError`: a config, bad input, a busy workdir, a
    failed start-up, a diverged run; a missing or unreadable file; a missing extra) is one line on stderr, with
    its traceback under -v, and exit 2 for a config, 1 otherwise. Anything else is a bug in this package: its
    traceback, a line saying so, and exit BUG_EXIT_CODE."""
    from transformer_jax.experiment import ConfigError

    try:
        return int(handler(args) or 0)
    except (UserError, OSError, ImportError) as error:
        if args.verbose:
            traceback.print_exc()
        is_config = isinstance(error, ConfigError)
        print(f"{'config error' if is_config else 'error'}: {error}", file=sys.stderr)
        return 2 if is_config else 1
    except Exception:
        traceback.print_exc()
        print(
            f"transformer-jax {args.command}: this is a bug in transformer_jax, not a problem with your input; "
            "please report it with the traceback above.",
            file=sys.stderr,
        )
        return BUG_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
