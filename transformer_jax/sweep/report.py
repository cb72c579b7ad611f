"""The report of a sweep: DIR/table.md, .csv and .json of every row's result (results.py) with its change from the first
row, ours and the paper's; table.png, those changes drawn; curves.png, every row's validation perplexity against
updates.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from transformer_jax.sweep.planning import PlannedRow, Sweep
from transformer_jax.sweep.results import validation_curve

TABLE = "table"  # DIR/table.md, .csv, .json, .png
CURVES = "curves.png"  # DIR/curves.png: every row's validation perplexity against updates

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
        plot_validation_perplexity(curves, directory / CURVES, sweep.title)
    return directory / f"{TABLE}.md"


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


def plot_validation_perplexity(
    curves: Mapping[str, tuple[str, list[tuple[int, float]]]], path: Path, title: str = ""
) -> None:
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
