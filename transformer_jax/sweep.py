"""Sweeps: one base experiment, named rows of config overrides, one workdir per row, one table of the results.

A sweep file is a Python file whose `get_sweep()` returns a `Sweep` (experiments/table3.py):

    Sweep(config="multi30k.py", overrides={"train.steps": 2000},             # the base, for every row
          rows=(SweepRow("base"), SweepRow("A h 1", {"model.num_heads": 1}, group="A")))

`transformer-jax sweep FILE --workdir DIR` trains each row in DIR/<row> (a finished row is skipped, an interrupted one
resumed) and writes DIR/table.{md,csv,json,png} of every row, again after each row it trains; `--rows` runs only the
rows it names. SIGTERM / SIGINT stop it as they stop `train` (the row's checkpoint saved, exit 143 / 130), with the
table of the rows finished; the same command resumes. Rows are compared at equal updates, so a row with a time budget
(train.max_minutes) is refused. A row is scored as the paper's Table 3 is, by the training run itself on the validation
split at its last update: perplexity per target token and BLEU of beam search (the experiment's decode section), no
checkpoint averaging. `--dry-run` prints each row's `transformer-jax train` command (for separate hosts, jobs or a SLURM
array); `--collect` builds the table from the row workdirs as they are. The table gives each row's change from the first
row (perplexity in %, BLEU in points; ours and the paper's), so the first row is the one the others change, and other
rows in its group are its repeats (other seeds): the plot shades the spread they show, what chance alone moves a row.
The overrides are applied as `--config.KEY=VALUE` would be: the sweep's, then the command line's, then the row's. Each
row names the CPU it trained on (a row resumed on another machine, both): its minutes compare with another row's only on
one CPU.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
import shlex
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from transformer_jax.experiment import ConfigError, Experiment, apply_overrides, exec_python_file, load_config_file

TABLE = "table"  # DIR/table.md, .csv, .json, .png
CURVES = "curves.png"  # DIR/curves.png: every row's validation perplexity against updates
METRICS = "metrics.jsonl"


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


def _metrics(workdir: Path) -> list[dict]:
    path = workdir / METRICS
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill: the rows before it stand
            continue
    return rows


def row_result(planned: PlannedRow) -> dict | None:
    """The row's scores at its last update (validation perplexity, beam BLEU), or None if it has not got there."""
    steps = planned.experiment.train.steps
    rows = _metrics(planned.workdir)
    at_end = {row["kind"]: row for row in rows if row.get("step") == steps}
    if "eval" not in at_end or "final_bleu" not in at_end:
        return None
    train_rows = [row for row in rows if row.get("kind") == "train"]
    from transformer_jax.accounting import count_parameters

    result = {
        "group": planned.row.group,
        "row": planned.row.name,
        "changes": ", ".join(f"{key}={value}" for key, value in planned.row.overrides.items()) or "(base)",
        "params": count_parameters(planned.experiment.model).total,
        "updates": steps,
        "train_minutes": _train_minutes(train_rows, steps),
        "cpu": " + ".join(dict.fromkeys(row["cpu"] for row in rows if row.get("kind") == "machine")),
        "ppl": at_end["eval"]["perplexity"],
        "bleu": at_end["final_bleu"]["bleu"],
        "bleu_lowercase": at_end["final_bleu"]["bleu_lowercase"],
        "workdir": str(planned.workdir),
    }
    result.update({f"paper_{key}": value for key, value in planned.row.reference.items()})
    return result


def _train_minutes(train_rows: list[dict], updates: int) -> float:
    """The row's updates times its median seconds per update over the logged windows (consecutive train rows of
    one process): a figure that a resume, a pause or the first window's compiling does not stretch."""
    per_update = [
        (row["elapsed_s"] - before["elapsed_s"]) / (row["step"] - before["step"])
        for before, row in zip(train_rows, train_rows[1:])
        if row["step"] > before["step"] and row["elapsed_s"] > before["elapsed_s"]
    ]
    return updates * statistics.median(per_update) / 60 if per_update else 0.0


class RowInterrupted(Exception):
    """A row's training stopped by SIGTERM / SIGINT: its checkpoint is saved and the sweep stops, to be run again."""

    def __init__(self, row: str, signal_name: str, update: int):
        super().__init__(f"sweep row {row!r} stopped by {signal_name} at update {update} (saved)")
        self.signal_name = signal_name


def finish_row(planned: PlannedRow) -> dict:
    """Trains the row (resuming its workdir) and, when the run reached its last update without scoring it (killed
    between the two), scores it; returns row_result. RowInterrupted when a signal stopped the training."""
    from transformer_jax.train import loop

    summary = loop.train(planned.experiment, planned.workdir)
    if summary["interrupted"]:
        raise RowInterrupted(planned.row.name, summary["interrupted"], summary["step"])
    result = row_result(planned)
    if result is None:
        _score_at_end(planned)
        result = row_result(planned)
    if result is None:
        raise RuntimeError(f"sweep row {planned.row.name!r} ended without its scores in {planned.workdir / METRICS}.")
    return result


def _score_at_end(planned: PlannedRow) -> None:
    """Validation loss and final BLEU of a workdir already at its last update, logged as training logs them."""
    from transformer_jax.train.loop import Trainer

    cfg = planned.experiment.train
    with Trainer(planned.experiment, planned.workdir) as trainer:
        if trainer.start != cfg.steps:
            return
        trainer.validation_loss(cfg.steps)
        method = cfg.final_bleu if cfg.final_bleu != "none" else "beam"
        trainer.validation_bleu(cfg.steps, "final_bleu", method, trainer.valid_pairs)


def run(planned: list[PlannedRow], *, log=print, after_row: Callable[[], object] | None = None) -> list[dict | None]:
    """Each row in turn: skipped when finished, else trained (or resumed), scored, and then `after_row()` (the
    table written again, so that it shows every row finished so far)."""
    results: list[dict | None] = []
    for index, row in enumerate(planned, start=1):
        result = row_result(row)
        if result is not None:
            log(f"[{index}/{len(planned)}] {row.row.name}: finished, skipped ({row.workdir})")
        else:
            log(f"[{index}/{len(planned)}] {row.row.name}: training in {row.workdir}")
            result = finish_row(row)
            if after_row is not None:
                after_row()
        log(f"[{index}/{len(planned)}] {row.row.name}: perplexity {result['ppl']:.2f}, BLEU {result['bleu']:.2f}")
        results.append(result)
    return results


COLUMNS = (
    ("group", "group", "{}"),
    ("row", "row", "{}"),
    ("changes", "changes", "{}"),
    ("params", "params (M)", "{:.2f}"),
    ("updates", "updates", "{}"),
    ("train_minutes", "train minutes", "{:.1f}"),
    ("cpu", "CPU", "{}"),
    ("ppl", "valid PPL", "{:.2f}"),
    ("ppl_change", "PPL vs row 1", "{:+.1%}"),
    ("bleu", "valid BLEU", "{:.2f}"),
    ("bleu_change", "BLEU vs row 1", "{:+.2f}"),
    ("paper_ppl", "paper PPL", "{:.2f}"),
    ("paper_ppl_change", "paper PPL vs row 1", "{:+.1%}"),
    ("paper_bleu", "paper BLEU", "{:.1f}"),
    ("paper_bleu_change", "paper BLEU vs row 1", "{:+.1f}"),
    ("paper_params_m", "paper params (M)", "{:.0f}"),
)


def with_changes(results: list[dict | None]) -> list[dict | None]:
    """Copies of the results with each one's change from the first row (the sweep's base), ours and, where both rows
    have it, the paper's: perplexity as a fraction (`ppl_change`), BLEU in points (`bleu_change`). The two scales
    differ; the directions and relative sizes compare."""
    first = results[0] if results else None
    changed: list[dict | None] = []
    for result in results:
        if result is not None and first is not None:
            result = dict(result)
            for ppl, bleu in (("ppl", "bleu"), ("paper_ppl", "paper_bleu")):
                if ppl in result and ppl in first:
                    result[f"{ppl}_change"] = result[ppl] / first[ppl] - 1
                if bleu in result and bleu in first:
                    result[f"{bleu}_change"] = result[bleu] - first[bleu]
        changed.append(result)
    return changed


def write_table(sweep: Sweep, planned: list[PlannedRow], results: list[dict | None], directory: Path) -> Path:
    """DIR/table.md (rows not finished marked so; the updates and minutes of those finished in its last line),
    table.csv and table.json (finished rows), table.png (once row 1 has finished) and curves.png (every row that has
    validated)."""
    directory.mkdir(parents=True, exist_ok=True)
    results = with_changes(results)
    done = [result for result in results if result is not None]
    present = [column for column in COLUMNS if any(column[0] in result for result in done) or column[0] == "row"]
    lines = [f"# {sweep.title}\n" if sweep.title else ""]
    lines += ["| " + " | ".join(title for _, title, _ in present) + " |", "|" + "---|" * len(present)]
    for row, result in zip(planned, results):
        if result is None:
            lines.append(f"| {row.row.group} | {row.row.name} | not finished ({row.workdir}) |")
            continue
        cells = []
        for key, _, form in present:
            value = result.get(key)
            if value is not None and key == "params":
                value /= 1e6
            cells.append("" if value is None else form.format(value))
        lines.append("| " + " | ".join(cells) + " |")
    updates = sum(result.get("updates", 0) for result in done)
    minutes = sum(result.get("train_minutes", 0.0) for result in done)
    lines.append(
        f"\n{len(done)} of {len(planned)} rows finished: {updates:,} updates, {minutes:.1f} train minutes in all."
    )
    (directory / f"{TABLE}.md").write_text("\n".join(lines).lstrip("\n") + "\n")
    (directory / f"{TABLE}.json").write_text(json.dumps(done, indent=2))
    with open(directory / f"{TABLE}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[key for key, _, _ in present] + ["bleu_lowercase", "workdir"])
        writer.writeheader()
        for result in done:
            writer.writerow({key: result.get(key) for key in writer.fieldnames})
    if results and results[0] is not None:  # the plot shows changes from row 1
        plot_table(done, directory / f"{TABLE}.png", sweep.title)
    curves = {row.row.name: (row.row.group, validation_curve(row.workdir)) for row in planned}
    if any(points for _, points in curves.values()):
        plot_curves(curves, directory / CURVES, sweep.title)
    return directory / f"{TABLE}.md"


def validation_curve(workdir: Path) -> list[tuple[int, float]]:
    """(update, validation perplexity) of every validation the row's run logged, by update (once each: a resumed
    run that validated an update again keeps the later figure)."""
    points = {row["step"]: row["perplexity"] for row in _metrics(workdir) if row.get("kind") == "eval"}
    return sorted(points.items())


OFF_SCALE_PPL = 2.0  # a row above twice row 1's perplexity failed or lagged far: its bars cut at the others' scale


def plot_limit(changes: Sequence[float], off_scale: Sequence[bool]) -> float:
    """The half-height of a panel of changes: 1.2 times the largest of those not off the scale (1 if none)."""
    return 1.2 * max((abs(change) for change, off in zip(changes, off_scale) if not off), default=0.0) or 1.0


def plot_table(results: list[dict], path: Path, title: str = "") -> None:
    """The rows' changes from the first row (`with_changes`), perplexity (%) above and BLEU (points) below: ours as
    bars, one colour per group, the paper's as black diamonds where both rows have the paper's figure, and shaded,
    the largest change among the first row's repeats (the other rows of its group). A row that failed or lagged far
    (above OFF_SCALE_PPL times row 1's perplexity) is a hatched bar cut at the panel's edge, its change on it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(result["group"] for result in results))
    colours = [plt.get_cmap("tab10")(groups.index(result["group"]) % 10) for result in results]
    names = [result["row"] for result in results]
    off_scale = [result["ppl_change"] > OFF_SCALE_PPL - 1 for result in results]
    figure, axes = plt.subplots(2, 1, figsize=(max(6.0, 0.45 * len(results) + 2), 6), sharex=True)
    for axis, key, scale, label, form in (
        (axes[0], "ppl", 100, "perplexity vs row 1 (%)", "{:+,.0f}%"),
        (axes[1], "bleu", 1, "BLEU vs row 1", "{:+.1f}"),
    ):
        ours = [scale * result[f"{key}_change"] for result in results]
        paper = [
            (i, scale * result[f"paper_{key}_change"])
            for i, result in enumerate(results)
            if f"paper_{key}_change" in result
        ]
        limit = plot_limit(ours + [change for _, change in paper], off_scale + [False] * len(paper))
        repeats = [abs(change) for change, result in zip(ours[1:], results[1:]) if result["group"] == groups[0]]
        if repeats:
            axis.axhspan(-max(repeats), max(repeats), color="grey", alpha=0.2, label="spread of row 1's repeats")
        shown = [max(-limit, min(limit, change)) for change in ours]
        bars = axis.bar(range(len(results)), shown, color=colours, label="ours (colour: group)")
        for i, (bar, change, off) in enumerate(zip(bars, ours, off_scale)):
            if off:
                bar.set_hatch("//")
                axis.text(
                    i,
                    shown[i] / 2,
                    form.format(change),
                    rotation=90,
                    ha="center",
                    va="center",
                    fontsize=7,
                    backgroundcolor="white",
                )
        if paper:
            axis.plot(*zip(*paper), "kD", markersize=5, label="paper")
        axis.axhline(0, color="grey", linewidth=1)
        axis.set_ylim(-limit, limit)
        axis.set_ylabel(f"validation {label}")
        axis.legend(fontsize=8)
    axes[1].set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=8)
    if title:
        axes[0].set_title(title, fontsize=9, wrap=True)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_curves(curves: Mapping[str, tuple[str, list[tuple[int, float]]]], path: Path, title: str = "") -> None:
    """Validation perplexity (log scale) against updates, {row name: (group, points)}: a panel per group, each with
    the first row (the base) in black, so a row's curve reads against the base's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (base_name, (_, base_points)), *_ = curves.items()
    groups = list(dict.fromkeys(group for group, points in curves.values() if points))
    figure, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups) + 1, 3.6), sharey=True, squeeze=False)
    for axis, group in zip(axes[0], groups):
        if base_points:
            axis.plot(*zip(*base_points), "k-o", markersize=3, label=base_name)
        for name, (row_group, points) in curves.items():
            if row_group == group and name != base_name and points:
                axis.plot(*zip(*points), "-o", markersize=3, label=name)
        axis.set_yscale("log")
        axis.set_title(group or "(no group)", fontsize=9)
        axis.set_xlabel("update")
        axis.legend(fontsize=7)
    axes[0][0].set_ylabel("validation perplexity")
    if title:
        figure.suptitle(title, fontsize=9, wrap=True)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
