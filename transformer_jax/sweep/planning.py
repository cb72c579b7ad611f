"""A sweep file and its rows resolved: each row's experiment (the base with the sweep's, the command line's and the
row's overrides, applied as `--config.KEY=VALUE` would be) and its workdir (DIR/<row slug>); `--rows` and the
commands of `--dry-run`.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from transformer_jax.experiment import ConfigError, Experiment, apply_overrides, exec_python_file, load_config_file


@dataclasses.dataclass(frozen=True)
class SweepRow:
    """One configuration: `overrides` ('section.field' -> value) on the base; `reference`: published figures to
    print beside ours (e.g. {"ppl": 5.29, "bleu": 24.9, "params_m": 58})."""

    name: str
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    group: str = ""
    reference: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @property
    def slug(self) -> str:
        """The row's workdir name: its name in lower case, runs of other characters as '-'."""
        return re.sub(r"[^a-z0-9.]+", "-", self.name.lower()).strip("-")


@dataclasses.dataclass(frozen=True)
class Sweep:
    """config: the base experiment file, relative to the sweep file; overrides: applied to every row."""

    config: str
    rows: tuple[SweepRow, ...]
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    title: str = ""


@dataclasses.dataclass(frozen=True)
class PlannedRow:
    """A row resolved: its experiment, its workdir and the overrides that make it, as command-line text."""

    row: SweepRow
    experiment: Experiment
    workdir: Path
    overrides: tuple[tuple[str, str], ...]


def override_text(value: Any) -> str:
    """A value as --config.KEY=VALUE takes it: strings as they are, anything else as its Python literal."""
    return value if isinstance(value, str) else repr(value)


def load_sweep_file(path: str | Path) -> tuple[Sweep, Path]:
    """The Sweep of a file's get_sweep() and the path of its base experiment file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file {path} not found; e.g. transformer-jax sweep experiments/table3.py ...")
    module = exec_python_file(path, "_sweep_")
    if module is None:
        raise ConfigError(f"{path} is not a Python file with get_sweep().")
    sweep = module.get_sweep() if hasattr(module, "get_sweep") else None
    if not isinstance(sweep, Sweep):
        raise ConfigError(f"{path} must define get_sweep() returning a transformer_jax.sweep.Sweep.")
    slugs = [row.slug for row in sweep.rows]
    duplicated = sorted({slug for slug in slugs if slugs.count(slug) > 1})
    if not sweep.rows or duplicated or not all(slugs):
        raise ConfigError(f"{path}: the rows need distinct, non-empty names (workdir names {duplicated} repeat).")
    return sweep, (path.parent / sweep.config).resolve()


def plan(
    sweep_file: str | Path, workdir: str | Path, overrides: Iterable[tuple[str, str]] = ()
) -> tuple[Sweep, Path, list[PlannedRow]]:
    """Every row resolved, in the sweep file's order; all configs are checked first."""
    sweep, config = load_sweep_file(sweep_file)
    base = load_config_file(config)
    common = [(key, override_text(value)) for key, value in sweep.overrides.items()] + list(overrides)
    planned = []
    for row in sweep.rows:
        texts = tuple(common + [(key, override_text(value)) for key, value in row.overrides.items()])
        try:
            experiment = apply_overrides(base, texts)
        except ConfigError as error:
            raise ConfigError(f"sweep row {row.name!r}: {error}") from None
        if experiment.train.max_minutes:
            raise ConfigError(
                f"sweep row {row.name!r} has train.max_minutes={experiment.train.max_minutes:g}: rows are compared "
                "at equal updates (train.steps), so a time budget would end them at different ones; set "
                "train.max_minutes=0 in the sweep's overrides."
            )
        planned.append(PlannedRow(row, experiment, Path(workdir) / row.slug, texts))
    return sweep, config, planned


def select(planned: list[PlannedRow], rows: str | None) -> list[PlannedRow]:
    """The rows named (by name or workdir name) in the comma-separated `rows`, in that order; all of them if None.
    A name may hold commas itself ("A: h 8, d_k 16"): at each place the longest run of pieces that names a row wins."""
    if not rows:
        return planned
    by_name = {key: row for row in planned for key in (row.row.name, row.row.slug)}
    pieces = rows.split(",")
    joined = lambda start, end: ",".join(pieces[start:end]).strip()  # noqa: E731
    chosen, unknown, start = [], [], 0
    while start < len(pieces):
        end = next((end for end in range(len(pieces), start, -1) if joined(start, end) in by_name), None)
        if end is None:
            unknown += [joined(start, start + 1)] if joined(start, start + 1) else []
            end = start + 1
        else:
            chosen.append(by_name[joined(start, end)])
        start = end
    if unknown:
        raise ConfigError(
            f"--rows {unknown}: no such row; name rows by name or by workdir name: "
            + ", ".join(f"{row.row.name!r} ({row.row.slug})" for row in planned)
            + "."
        )
    return chosen


def train_command(config: Path, planned: PlannedRow) -> str:
    """The shell command that trains one row on its own (what --dry-run prints)."""
    words = ["transformer-jax", "train", "--config", _shown(config), "--workdir", str(planned.workdir)]
    words += [f"--config.{key}={value}" for key, value in planned.overrides]
    return shlex.join(words)


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
