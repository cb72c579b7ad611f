"""The rows trained in turn: a finished row skipped, an unfinished one trained (or resumed) in its workdir and, if its
run stopped at its last update before scoring it there, scored from its workdir (score.py)."""

from __future__ import annotations

from collections.abc import Callable

from transformer_jax import run_log
from transformer_jax.sweep.planning import PlannedRow
from transformer_jax.sweep.results import row_result


class RowInterrupted(Exception):
    """A row's training stopped by SIGTERM / SIGINT: its checkpoint is saved and the sweep stops, to be run again."""

    def __init__(self, row: str, signal_name: str, update: int):
        super().__init__(f"sweep row {row!r} stopped by {signal_name} at update {update} (saved)")
        self.signal_name = signal_name


def finish_row(planned: PlannedRow) -> dict:
    """Trains the row (resuming its workdir) and, when the run reached its last update without scoring it (killed
    between the two, or train.final_bleu='none'), scores it; returns row_result. RowInterrupted when a signal
    stopped the training."""
    from transformer_jax.sweep.score import score_at_end
    from transformer_jax.train import loop

    summary = loop.train(planned.experiment, planned.workdir)
    if summary["interrupted"]:
        raise RowInterrupted(planned.row.name, summary["interrupted"], summary["step"])
    result = row_result(planned)
    if result is None:
        score_at_end(planned.experiment, planned.workdir)
        result = row_result(planned)
    if result is None:
        raise RuntimeError(
            f"sweep row {planned.row.name!r} ended without its scores in {run_log.log_path(planned.workdir)}."
        )
    return result


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
