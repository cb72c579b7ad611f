"""Checkpoints chosen by a validation metric, not by their position in the run (fairseq's --best-checkpoint-metric).

A run validates at its checkpoint steps when train.eval_every (perplexity) or train.bleu_every (BLEU) divides
train.checkpoint_every. The metrics (train.best_metric):
    perplexity   validation perplexity per target token (metrics.jsonl 'eval' rows), lower is better
    bleu         greedy BLEU of the first train.bleu_max_sentences validation pairs ('bleu' rows), higher is better
train.keep_best keeps the best checkpoints beside the latest train.keep_checkpoints (checkpoint.Checkpointer), so
a longer run can only add candidates; `transformer-jax average --best K` averages the K best of those kept and
`--checkpoint best` loads the best one. Only validation chooses: the test split never does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

BestMetric = Literal["perplexity", "bleu"]  # train.best_metric, `average --metric`
# metric -> (the metrics.jsonl row kind, its field, which way is better)
BEST_METRICS: dict[BestMetric, tuple[str, str, Literal["min", "max"]]] = {
    "perplexity": ("eval", "perplexity", "min"),
    "bleu": ("bleu", "bleu", "max"),
}


def validation_scores(rows: Iterable[dict], metric: BestMetric, within_s: float | None = None) -> dict[int, float]:
    """{update: the metric's value} of every validation in a run's metrics.jsonl `rows` (the last, if logged twice),
    or of those logged within `within_s` seconds of the start of `train`."""
    kind, field, _ = BEST_METRICS[metric]
    return {
        row["step"]: float(row[field])
        for row in rows
        if row["kind"] == kind and field in row and (within_s is None or row["elapsed_s"] <= within_s)
    }


def best_steps(scores: Mapping[int, float], candidates: Iterable[int], k: int, metric: BestMetric) -> list[int]:
    """The `k` candidate steps with the best scores (equal scores: the later step first), in step order; candidates
    without a score are not ranked."""
    sign = 1.0 if BEST_METRICS[metric][2] == "min" else -1.0
    ranked = sorted((step for step in candidates if step in scores), key=lambda step: (sign * scores[step], -step))
    return sorted(ranked[:k])
