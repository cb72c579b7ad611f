"""What a row's run log (run_log.py) says of it: its result at its last update (validation perplexity, beam BLEU, its
parameters, updates and train minutes, the CPUs it ran on), and its validation curve."""

from __future__ import annotations

import statistics
from pathlib import Path

from transformer_jax import run_log
from transformer_jax.sweep.planning import PlannedRow


def row_result(planned: PlannedRow) -> dict | None:
    """The row's scores at its last update (validation perplexity, beam BLEU), or None if it has not got there."""
    steps = planned.experiment.train.steps
    rows = run_log.read_rows(planned.workdir)
    at_end = {row["kind"]: row for row in rows if row["step"] == steps}
    if "eval" not in at_end or "final_bleu" not in at_end:
        return None
    from transformer_jax.accounting import count_parameters

    result = {
        "group": planned.row.group,
        "row": planned.row.name,
        "changes": ", ".join(f"{key}={value}" for key, value in planned.row.overrides.items()) or "(base)",
        "params": count_parameters(planned.experiment.model).total,
        "updates": steps,
        "train_minutes": train_minutes(rows, steps),
        "cpu": " + ".join(dict.fromkeys(row["cpu"] for row in rows if row["kind"] == "machine")),
        "ppl": at_end["eval"]["perplexity"],
        "bleu": at_end["final_bleu"]["bleu"],
        "bleu_lowercase": at_end["final_bleu"]["bleu_lowercase"],
        "workdir": str(planned.workdir),
    }
    result.update({f"paper_{key}": value for key, value in planned.row.reference.items()})
    return result


def train_minutes(rows: list[dict], updates: int) -> float:
    """The row's updates times its median seconds per update over the logged windows of its run log `rows`
    (run_log.read_rows), consecutive train rows of one `train` command (a machine row starts each, and a window
    whose clock went back spans two): a figure that a resume, a pause or the first window's compiling does not
    stretch."""
    per_update, before = [], None
    for row in rows:
        if row["kind"] == "machine":
            before = None
        elif row["kind"] == "train":
            if before is not None and row["elapsed_s"] > before["elapsed_s"]:
                per_update.append((row["elapsed_s"] - before["elapsed_s"]) / (row["step"] - before["step"]))
            before = row
    return updates * statistics.median(per_update) / 60 if per_update else 0.0


def validation_curve(workdir: Path) -> list[tuple[int, float]]:
    """(update, validation perplexity) of every validation the row's run logged, by update (once each: a resumed
    run that validated an update again keeps the later figure)."""
    return [(row["step"], row["perplexity"]) for row in run_log.read_rows(workdir) if row["kind"] == "eval"]
