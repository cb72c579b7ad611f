"""`transformer-jax <command>`: train, sweep, prepare, plan, translate, score, evaluate, average, export, import.

The commands are `command.Command`s, listed by group in the COMMANDS of train.py (train, sweep), prepare.py
(prepare), plan.py (plan), inference.py (translate, score), evaluation.py (evaluate, average) and interop.py
(export-torch, export-ctranslate2, import-torch, import-hf, export-hf); a new command is one more there. Each
handler imports what it runs when it runs. This module assembles the parser and is the one place that turns how a
command ended into its exit code (`run_handler`).

Config overrides (`--config.section.field=value`) are collected for every command that declares `--config` and
applied with `transformer_jax.experiment.apply_overrides` (parsed by each field's type; unknown fields are errors).
"""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
import traceback
from collections.abc import Sequence

from transformer_jax import __version__
from transformer_jax.cli import evaluation, inference, interop, plan, prepare, train
from transformer_jax.cli.command import Handler, Stopped
from transformer_jax.errors import ArgumentError, ConfigError, UserError

COMMANDS = (
    *train.COMMANDS,
    *prepare.COMMANDS,
    *plan.COMMANDS,
    *inference.COMMANDS,
    *evaluation.COMMANDS,
    *interop.COMMANDS,
)
OVERRIDE = re.compile(r"^--config\.([A-Za-z_][\w.]*)(?:=(.*))?$", re.DOTALL)
BUG_EXIT_CODE = 70  # EX_SOFTWARE (sysexits.h): an internal error


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


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; the parsed arguments carry the command's handler as `handler`."""
    parser = argparse.ArgumentParser(prog="transformer-jax", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--compilation-cache",
        metavar="DIR|off",
        default=None,
        help="persistent XLA compilation cache: a second run of the same config skips compiling "
        "(default: $TRANSFORMER_JAX_COMPILATION_CACHE or ~/.cache/transformer_jax/xla)",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        sub = subparsers.add_parser(
            command.name,
            help=command.help,
            description=command.help,
            epilog=command.epilog(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.declare(sub)
        sub.set_defaults(handler=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        rest, overrides = split_overrides(argv)
    except SystemExit as error:
        print(error, file=sys.stderr)
        return 2
    parser = build_parser()
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
    return run_handler(args.handler, args)


def run_handler(handler: Handler, args: argparse.Namespace) -> int:
    """Runs a command; how it ended is its exit code. It returned: 0. A signal stopped it (`Stopped`): 128 + the
    signal's number, as shells report (130 SIGINT, 141 SIGPIPE, 143 SIGTERM). A mistake the user can fix
    (`errors.UserError`: a config, bad input, a busy workdir, a failed start-up, a diverged run; a missing or
    unreadable file; a missing extra): one line on stderr, with its traceback under -v, and exit 2 for a config or
    an argument out of range, 1 otherwise. Anything else is a bug in this package: its traceback, a line saying
    so, and exit BUG_EXIT_CODE."""
    try:
        handler(args)
    except Stopped as stop:
        return 128 + signal.Signals[stop.signal_name]
    except (UserError, OSError, ImportError) as error:
        if args.verbose:
            traceback.print_exc()
        is_config = isinstance(error, ConfigError)
        print(f"{'config error' if is_config else 'error'}: {error}", file=sys.stderr)
        return 2 if isinstance(error, (ConfigError, ArgumentError)) else 1
    except Exception:
        traceback.print_exc()
        print(
            f"transformer-jax {args.command}: this is a bug in transformer_jax, not a problem with your input; "
            "please report it with the traceback above.",
            file=sys.stderr,
        )
        return BUG_EXIT_CODE
    return 0
