"""What a command is: its name, its help, the arguments it declares, its handler, the examples its --help shows;
and `Stopped`, how a handler says a signal stopped it."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable

Handler = Callable[[argparse.Namespace], None]

CHECKPOINT_HELP = (
    "a step number, 'latest' (the default), 'best' (the best on validation, train.best_metric), 'averaged' (see "
    "`average`) or 'imported' (see `import-torch`)"
)


@dataclasses.dataclass(frozen=True)
class Command:
    """`transformer-jax NAME`: `declare(parser)` adds its arguments, `run(args)` runs it and raises what stops it
    (the exit code is `transformer_jax.cli.run_handler`'s); `note` and `examples` end its --help."""

    name: str
    help: str
    declare: Callable[[argparse.ArgumentParser], None]
    run: Handler
    examples: tuple[str, ...]
    note: str = ""

    def epilog(self) -> str:
        return "\n".join([*([self.note] if self.note else []), "examples:", *(f"  {line}" for line in self.examples)])


class Stopped(Exception):
    """Raised by a handler that a signal stopped, once it has said so: the command exits 128 + the signal's number."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name
