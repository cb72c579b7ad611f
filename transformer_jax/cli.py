"""`transformer-jax <command>`: train now; translate / evaluate / average register themselves the same way.

Adding a command:

    @register("translate", help="Translate text with a trained workdir.")
    def translate_command(parser):          # called once to declare the arguments
        parser.add_argument("--workdir", required=True)
        return run_translate                # run_translate(args) -> exit code (or None = 0)

Config overrides (`--config.section.field=value`) are collected for every command that declares
`--config` and applied with `transformer_jax.train.loop.apply_overrides` (unknown fields are errors).
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from typing import Callable, Sequence

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
    """Experiment config from a file, completed with the defaults, with command-line overrides applied."""
    from transformer_jax.train import loop

    config = loop.complete_config(loop.load_config_file(path))
    loop.apply_overrides(config, overrides)
    return config


# ---------------------------------------------------------------------------------------------- train


@register("train", help="Train (or resume) an experiment in a workdir.")
def _train_command(parser: argparse.ArgumentParser) -> Handler:
    parser.add_argument("--config", required=True, help="experiment file with get_config(), e.g. experiments/tiny.py")
    parser.add_argument("--workdir", required=True, help="run directory; an existing one is resumed")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.epilog = "Override any config field with --config.section.field=value, e.g. --config.train.steps=100."
    return _run_train


def _run_train(args: argparse.Namespace) -> int:
    from transformer_jax.train import loop

    try:
        config = load_experiment(args.config, args.config_overrides)
        if args.print_config:
            print(json.dumps(config.to_dict(), indent=2, default=list))
            return 0
        summary = loop.train(config, args.workdir)
    except loop.ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    eval_metrics = summary.get("eval") or {}
    line = f"done: update {summary['step']}"
    if eval_metrics:
        line += f", validation NLL {eval_metrics['nll']:.4f} (perplexity {eval_metrics['perplexity']:.2f})"
    if summary.get("interrupted"):
        line += f"; stopped by {summary['interrupted']}, rerun the same command to resume"
    print(line + f"; workdir {args.workdir}")
    return 0


# ---------------------------------------------------------------------------------------------- main


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    parser = argparse.ArgumentParser(prog="transformer-jax", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    handlers = {}
    for name, command in COMMANDS.items():
        sub = subparsers.add_parser(name, help=command.help, description=command.help)
        handlers[name] = command.declare(sub)
    return parser, handlers


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
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(handlers[args.command](args) or 0)


if __name__ == "__main__":
    sys.exit(main())
