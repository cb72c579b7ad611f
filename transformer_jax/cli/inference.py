"""Decoding with a trained workdir: `translate` (text in, text out), `score` (given translations' log-probabilities),
and the decoding arguments they share with evaluation.py's `evaluate`."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from transformer_jax.cli.command import CHECKPOINT_HELP, Command, Stopped
from transformer_jax.errors import ArgumentError, DataError, UsageError


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", required=True, help="the --workdir of a `transformer-jax train` run")
    parser.add_argument("--checkpoint", default=None, help=CHECKPOINT_HELP)
    parser.add_argument(
        "--ensemble",
        nargs="+",
        default=(),
        metavar="WORKDIR",
        help="more workdirs (same tokenizer; the same --checkpoint of each) decoded with --workdir as one model: "
        "the mean of their next-token probabilities",
    )


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    from transformer_jax.decoding import DecodeConfig

    add_model_arguments(parser)
    method = parser.add_mutually_exclusive_group()
    method.add_argument("--greedy", action="store_true", help="greedy decoding instead of beam search")
    method.add_argument(
        "--sample", action="store_true", help="sampling (--num-samples, --temperature, --top-k, --top-p, --seed)"
    )
    for field in dataclasses.fields(DecodeConfig):  # --beam-size, --alpha, ...: one flag per DecodeConfig field
        kind = type(field.default) if field.default is not None else int
        parser.add_argument(
            f"--{field.name.replace('_', '-')}", type=kind, default=field.default, help=field.metadata.get("help")
        )
    parser.add_argument("--batch-size", type=int, default=32, help="sentences decoded together")
    _add_devices_argument(parser)


def _add_devices_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--devices",
        type=int,
        default=0,
        help="split each batch over this many of the process's devices (0, the default: all of them; the batch is "
        "rounded up to a multiple)",
    )


def _local_devices(count: int) -> list:
    import jax

    devices = jax.local_devices()
    if not 0 <= count <= len(devices):
        raise ArgumentError(
            f"--devices {count}: this process has {len(devices)} device(s) ({devices[0].platform}); give at most "
            f"{len(devices)}, or 0 for all."
        )
    return devices[: count or len(devices)]


def translator_from_args(args: argparse.Namespace, **options):
    """The Translator the decoding arguments describe (--workdir, --checkpoint, --greedy, --beam-size, ...)."""
    from transformer_jax.decoding import DecodeConfig
    from transformer_jax.translate import Translator

    fields = dataclasses.fields(DecodeConfig)
    decode_config = DecodeConfig(**{field.name: getattr(args, field.name) for field in fields})
    return Translator.from_workdir(
        args.workdir,
        args.checkpoint,
        ensemble=args.ensemble,
        decode_config=decode_config,
        method=decoding_method(args),
        batch_size=args.batch_size,
        devices=_local_devices(args.devices),
        **options,
    )


def decoding_method(args: argparse.Namespace) -> str:
    return "greedy" if args.greedy else "sample" if args.sample else "beam"


# ------------------------------------------------------------------------------------------------ translate


def _declare_translate(parser: argparse.ArgumentParser) -> None:
    add_decoding_arguments(parser)
    parser.add_argument("--input", help="read source lines from this file (default: stdin)")
    parser.add_argument("--output", help="write translations to this file (default: stdout)")
    parser.add_argument(
        "--nbest", type=int, default=1, help="hypotheses per line: best first (at most the beam), or the samples"
    )
    parser.add_argument("--prefix", help="a file of target prefixes, one per input line: each translation starts so")
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
    parser.add_argument(
        "--shard",
        default="0/1",
        help="K/N: translate only the lines whose 0-based number is K modulo N (process K of N on one file; merge "
        "text or jsonl outputs with `paste -d '\\n' out.0 ... out.N-1 | head -n LINES`, tsv with "
        "`sort -n -s -m -k1,1`)",
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue an interrupted --output: skip the lines it holds, append"
    )


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


def _shard(text: str) -> tuple[int, int]:
    """'K/N' -> (K, N) with 0 <= K < N."""
    k, _, n = text.partition("/")
    if not (k.isdigit() and n.isdigit()) or not 0 <= int(k) < int(n):
        raise UsageError(f"--shard {text}: give K/N with 0 <= K < N (this process's share of the lines, e.g. 0/4).")
    return int(k), int(n)


def _lines_done(path: Path, fmt: str) -> int:
    """How many input lines an interrupted --output holds, whole; a line cut by the kill is removed."""
    if not path.is_file():
        return 0
    data = path.read_bytes()
    whole = data[: data.rfind(b"\n") + 1]
    if len(whole) < len(data):
        path.write_bytes(whole)
    rows = whole.decode("utf-8").splitlines()
    return len({row.split("\t", 1)[0] for row in rows}) if fmt == "tsv" else len(rows)


def _run_translate(args: argparse.Namespace) -> None:
    if args.nbest > 1 and args.format == "text":
        args.format = "tsv"  # several hypotheses need their rank and score
    if args.prefix and not Path(args.prefix).is_file():
        raise UsageError(f"--prefix {args.prefix}: no such file (give one target prefix per input line).")
    if args.resume and not args.output:
        raise UsageError("--resume continues an --output file: give --output.")
    shard = _shard(args.shard)
    done = _lines_done(Path(args.output), args.format) if args.resume else 0
    read, count, started = [0], 0, time.perf_counter()

    def counted(lines):
        for line in lines:
            yield line
            read[0] += 1

    try:
        translator = translator_from_args(args, on_too_long=args.on_too_long, max_tokens=args.max_tokens)
        with contextlib.ExitStack() as files:
            source = (
                files.enter_context(open(args.input, "rb")) if args.input else getattr(sys.stdin, "buffer", sys.stdin)
            )
            mode = "a" if args.resume else "w"
            sink = files.enter_context(open(args.output, mode, encoding="utf-8")) if args.output else sys.stdout
            prefixes = _utf8_lines(files.enter_context(open(args.prefix, "rb"))) if args.prefix else None
            stream = translator.translate_stream(
                counted(_utf8_lines(source)),
                chunk_lines=args.chunk_lines,
                nbest=args.nbest,
                progress=True,
                prefixes=prefixes,
                shard=shard,
                skip=done,
            )
            for number, line, hypotheses in stream:
                sink.write(_format_translation(number, line, hypotheses, args.format))
                sink.flush()
                count += 1
    except UnicodeDecodeError as error:
        raise DataError(
            f"input line {read[0] + 1} is not UTF-8 ({error.reason} at byte {error.start}); the lines before it "
            f"were translated. Convert the input, e.g. iconv -f LATIN1 -t UTF-8 FILE."
        ) from error
    except BrokenPipeError:  # the reader went away (e.g. `| head -1`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise Stopped("SIGPIPE") from None
    seconds = time.perf_counter() - started
    resumed = f" after the {done} done before" if done else ""
    print(
        f"translated {count} lines{resumed} in {seconds:.1f} s ({count / max(seconds, 1e-9):.1f} lines/s)",
        file=sys.stderr,
    )


# ---------------------------------------------------------------------------------------------------- score


def _declare_score(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--source", required=True, help="source lines")
    parser.add_argument("--target", required=True, help="their translations, one per source line")
    parser.add_argument("--output", help="write the scores to this file (default: stdout)")
    parser.add_argument("--batch-size", type=int, default=32, help="pairs scored together")
    _add_devices_argument(parser)
    parser.add_argument(
        "--format",
        choices=("tsv", "jsonl"),
        default="tsv",
        help="tsv: line, log P(target | source), target tokens, per-token log-probabilities; jsonl: the same as "
        "{line, log_prob, tokens, token_log_probs}",
    )


def _run_score(args: argparse.Namespace) -> None:
    from transformer_jax.data.local_files import read_lines
    from transformer_jax.translate import Translator

    sources, targets = list(read_lines(Path(args.source))), list(read_lines(Path(args.target)))
    if len(sources) != len(targets):
        raise UsageError(
            f"{args.source} has {len(sources)} lines but {args.target} has {len(targets)}; they must pair up line "
            "by line."
        )
    translator = Translator.from_workdir(
        args.workdir,
        args.checkpoint,
        ensemble=args.ensemble,
        batch_size=args.batch_size,
        devices=_local_devices(args.devices),
    )
    scores = translator.score(sources, targets, progress=True)
    with open(args.output, "w", encoding="utf-8") if args.output else contextlib.nullcontext(sys.stdout) as sink:
        for number, score in enumerate(scores, start=1):
            count = len(score.tokens)
            if args.format == "jsonl":
                row = {"line": number, "log_prob": score.log_prob, "tokens": count, "token_log_probs": score.tokens}
                sink.write(json.dumps(row) + "\n")
            else:
                per_token = " ".join(f"{value:.4f}" for value in score.tokens)
                sink.write(f"{number}\t{score.log_prob:.4f}\t{count}\t{per_token}\n")


COMMANDS = (
    Command(
        "translate",
        help="Translate text line by line with a trained workdir (stdin/stdout by default).",
        declare=_declare_translate,
        run=_run_translate,
        examples=(
            "transformer-jax translate --workdir runs/tiny --checkpoint averaged < in.en > out.de",
            "transformer-jax translate --workdir runs/tiny --input in.en --nbest 4 --format jsonl",
            "transformer-jax translate --workdir runs/de-en --sample --top-k 10 --seed 1 < mono.de > synthetic.en",
            "transformer-jax translate --workdir runs/tiny --greedy --input in.en --prefix prefixes.de",
            "transformer-jax translate --workdir runs/x --sample --input mono.de --output bt.1 --shard 1/4 --resume",
        ),
    ),
    Command(
        "score",
        help="Score given translations: log P(target | source) and each token's log-probability (teacher forcing).",
        declare=_declare_score,
        run=_run_score,
        examples=("transformer-jax score --workdir runs/tiny --source in.en --target out.de > scores.tsv",),
    ),
)
