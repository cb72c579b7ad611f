"""A training run's log, {workdir}/metrics.jsonl: one JSON object a line, appended as the run goes.

A row is {"kind": ..., "step": update, "elapsed_s": seconds since its `train` command started (tokenizer and
compiling included), ...values}; the kinds:

  machine     where the `train` command runs (machine.describe(): cpu, cpu_cores, devices, jax), at the update it
              starts from
  train       means since the previous train row: loss, nll, perplexity, accuracy, tokens (target tokens),
              learning_rate, grad_norm, tokens_per_sec (source + target tokens of all processes, padding excluded)
  eval        validation loss, nll, perplexity, accuracy, tokens (token-weighted over the validation batches)
  bleu        greedy BLEU / chrF of the first train.bleu_max_sentences validation pairs (train.bleu_every)
  final_bleu  BLEU / chrF of the whole validation split after the last update (train.final_bleu)

A resumed run appends to the same file and logs again the updates after its checkpoint: `read_rows` keeps the last
row of each (kind, step). A write cut short (a killed or crashed process) can leave a partial last line: the reader
skips it, and the next writer removes it before appending.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformer_jax.errors import UserError

FILENAME = "metrics.jsonl"


class RunLogError(UserError, ValueError):
    """A run log with a line that is not a JSON row before its last line: the file was damaged, not cut."""


def log_path(workdir: str | Path) -> Path:
    """{workdir}/metrics.jsonl."""
    return Path(workdir) / FILENAME


class RunLogWriter:
    """Appends rows to {workdir}/metrics.jsonl, each flushed as it is written, until close()."""

    def __init__(self, workdir: str | Path):
        path = log_path(workdir)
        _end_cut_tail(path)
        self._file = open(path, "a")  # noqa: SIM115 - open for the run, closed by close()

    def append(self, kind: str, step: int, elapsed_s: float, values: Mapping[str, Any]) -> None:
        """One row: {"kind": kind, "step": step, "elapsed_s": elapsed_s to 0.01 s, **values}."""
        row = {"kind": kind, "step": step, "elapsed_s": round(elapsed_s, 2), **values}
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _end_cut_tail(path: Path) -> None:
    """A last line without its newline is dropped if it is not a JSON row (a write cut short) and ended if it is,
    so that the next row starts a line of its own."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    start = data.rfind(b"\n") + 1
    try:
        json.loads(data[start:])
    except ValueError:
        with open(path, "r+b") as file:
            file.truncate(start)
    else:
        with open(path, "ab") as file:
            file.write(b"\n")


def read_rows(workdir: str | Path) -> list[dict]:
    """The rows of {workdir}/metrics.jsonl ([] when there is none), in step order (rows of one step in the order
    they were written); of rows with the same (kind, step), logged again by a resumed run, the last written wins.

    An unparseable last line (a write cut short) is skipped; one before it raises RunLogError naming the file and
    the line.
    """
    path = log_path(workdir)
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    last = max((number for number, line in enumerate(lines) if line.strip()), default=-1)
    rows: dict[tuple[str, int], dict] = {}
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            if number == last:
                break
            raise RunLogError(
                f"{path}, line {number + 1}: not a JSON row ({error}); only the last line of a run log may be cut. "
                "Repair or delete that line."
            ) from None
        key = (row["kind"], row["step"])
        rows.pop(key, None)  # the row moves to where its last copy was written
        rows[key] = row
    return sorted(rows.values(), key=lambda row: row["step"])
