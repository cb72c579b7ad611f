"""The command line tells a user's mistake (one line, exit 1 or 2) from a bug in this package (traceback, exit 70)."""

import argparse

import pytest

from transformer_jax import cli
from transformer_jax.errors import DataError
from transformer_jax.experiment import ConfigError


def run(error: BaseException, verbose: bool = False) -> int:
    def handler(args):
        raise error

    return cli.run_handler(handler, argparse.Namespace(verbose=verbose, command="train"))


@pytest.mark.parametrize(
    "error, code, line",
    [
        (ConfigError("train.steps=-1 must be positive"), 2, "config error: train.steps=-1 must be positive"),
        (DataError("train.de, line 3: not valid UTF-8"), 1, "error: train.de, line 3: not valid UTF-8"),
        (FileNotFoundError("runs/x/config.json not found"), 1, "error: runs/x/config.json not found"),
    ],
)
def test_a_users_mistake_is_one_line_and_its_traceback_only_with_verbose(capsys, error, code, line):
    assert run(error) == code
    assert capsys.readouterr().err.strip() == line
    assert run(error, verbose=True) == code
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.strip().endswith(line)


@pytest.mark.parametrize(
    "error", [ValueError("shapes (3, 4) and (5,) do not align"), KeyError("params"), TypeError("x")]
)
def test_anything_else_is_a_bug_with_its_traceback(capsys, error):
    assert run(error) == cli.BUG_EXIT_CODE
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and type(error).__name__ in err
    assert "this is a bug in transformer_jax" in err
