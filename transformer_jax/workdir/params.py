"""A trained run's parameters: a checkpoint's, the model to translate with, averages over checkpoints (the last N
or the best N on validation), and the named sets stored beside the checkpoints (averaged/, imported/)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from transformer_jax import run_log
from transformer_jax.checkpoint import CHECKPOINT_DIR, Checkpointer, on_first_device
from transformer_jax.errors import ArgumentError, UsageError
from transformer_jax.selection import BestMetric, best_steps, validation_scores
from transformer_jax.workdir.run import load_config, model_config_from_workdir, save_json

logger = logging.getLogger(__name__)

# Parameter sets stored beside the training checkpoints, selected by name instead of a step.
NAMED_PARAMS = ("averaged", "imported")
BEST = "best"  # --checkpoint best: the kept checkpoint with the best validation metric
LATEST = "latest"  # --checkpoint latest: the newest checkpoint, as no --checkpoint


# ------------------------------------------------------------------------------- trained models, averaging


def load_params(workdir: str | Path, checkpoint: int | str | None = None) -> Any:
    """Parameters of a run: checkpoint None or 'latest' = the latest step, an int (or digits) = that step, 'best' =
    the kept checkpoint with the best validation metric (the run's train.best_metric, selection.py), or one of
    NAMED_PARAMS ('averaged' from `transformer-jax average`, 'imported' from `import-torch` or `import-hf`). A
    workdir without checkpoints but with imported parameters (`import-hf`) gives those for None or 'latest'."""
    workdir = Path(workdir)
    if checkpoint in (None, LATEST) and not (workdir / CHECKPOINT_DIR).is_dir() and (workdir / "imported").is_dir():
        checkpoint = "imported"
    if isinstance(checkpoint, str) and checkpoint in NAMED_PARAMS:
        return restore_named_params(workdir, checkpoint)
    if checkpoint == BEST:
        checkpoint = best_checkpoints(workdir, 1, run_best_metric(workdir))[0]
    if checkpoint == LATEST:
        checkpoint = None
    if isinstance(checkpoint, str) and not checkpoint.isdigit():
        raise UsageError(
            f"checkpoint {checkpoint!r} is not one: use a step number, {LATEST!r}, {BEST!r} or one of {NAMED_PARAMS}."
        )
    checkpointer = Checkpointer(workdir, keep=None, async_save=False)
    try:
        step = None if checkpoint is None else int(checkpoint)
        if step is not None and step not in checkpointer.all_steps():
            raise FileNotFoundError(
                f"No checkpoint at step {step} in {checkpointer.directory}; available steps: "
                f"{checkpointer.all_steps()}."
            )
        return checkpointer.restore_params(step)
    finally:
        checkpointer.close()


def load_model_for_inference(workdir: str | Path, checkpoint: int | str | None = None):
    """(ModelConfig, params, tokenizer) of the run in `workdir` (checkpoint as in `load_params`).

    params is a nested dict of arrays for `Transformer(model_config).apply({'params': params}, ...)`.
    """
    from transformer_jax.data.tokenizer import load_tokenizer

    model_config = model_config_from_workdir(workdir)
    params = load_params(workdir, checkpoint)
    return model_config, params, load_tokenizer(workdir)


def average_params(workdir: str | Path, steps: list[int] | None = None, last: int | None = None) -> Any:
    """Element-wise mean of the parameters of several checkpoints (paper §6.1 averages the last 5 / 20).

    steps: explicit steps; else the `last` most recent ones (default all kept).
    """
    checkpointer = Checkpointer(workdir, keep=None, async_save=False)
    try:
        available = checkpointer.all_steps()
        chosen = steps if steps is not None else available[-last:] if last else available
        missing = sorted(set(chosen) - set(available))
        if missing or not chosen:
            raise FileNotFoundError(
                f"Checkpoints {missing or chosen} not in {checkpointer.directory}; available steps: {available}."
            )
        total = None
        for step in chosen:
            params = jax.tree.map(lambda x: np.asarray(x, np.float64), checkpointer.restore_params(step))
            total = params if total is None else jax.tree.map(np.add, total, params)
        return jax.tree.map(lambda x: (x / len(chosen)).astype(np.float32), total)
    finally:
        checkpointer.close()


def kept_steps(workdir: str | Path) -> list[int]:
    """The steps of the checkpoints the run in `workdir` still holds, oldest first."""
    if not (Path(workdir) / CHECKPOINT_DIR).is_dir():
        raise FileNotFoundError(
            f"{Path(workdir) / CHECKPOINT_DIR} not found: is {workdir} the --workdir of a `transformer-jax train` run?"
        )
    checkpointer = Checkpointer(workdir, keep=None, async_save=False)
    try:
        return checkpointer.all_steps()
    finally:
        checkpointer.close()


def run_best_metric(workdir: str | Path) -> BestMetric:
    """The validation metric the run in `workdir` keeps its best checkpoints by (train.best_metric)."""
    return load_config(workdir).get("train", {}).get("best_metric", "perplexity")


def best_checkpoints(workdir: str | Path, k: int, metric: BestMetric) -> list[int]:
    """The `k` kept checkpoints with the best validation `metric` (selection.py), in step order."""
    available = kept_steps(workdir)
    steps = best_steps(validation_scores(run_log.read_rows(workdir), metric), available, k, metric)
    if not steps:
        raise FileNotFoundError(
            f"none of the checkpoints {available} in {workdir} has a validation {metric} in {run_log.FILENAME}: "
            "the run validated at other steps. Train with train.eval_every (perplexity) or train.bleu_every (bleu) "
            "dividing train.checkpoint_every, or choose checkpoints by position (`average --last N`, a step number)."
        )
    return steps


def average_best(workdir: str | Path, best: int, metric: BestMetric) -> tuple[list[int], Path]:
    """Averages the `best` kept checkpoints with the best validation `metric` into {workdir}/averaged. Returns (the
    steps averaged, the directory written); fewer ranked checkpoints than `best` average what exists, with a
    warning."""
    if best < 1:
        raise ArgumentError(f"--best {best}: give how many checkpoints to average (1 or more).")
    steps = best_checkpoints(workdir, best, metric)
    if len(steps) < best:
        logger.warning(
            "only %d checkpoints of %s have a validation %s; averaging %s.", len(steps), workdir, metric, steps
        )
    return steps, save_named_params(workdir, "averaged", average_params(workdir, steps=steps), steps)


def average_last(workdir: str | Path, last: int, *, from_fraction: float = 0.0) -> tuple[list[int], Path]:
    """Averages the `last` most recent checkpoints into {workdir}/averaged (`--checkpoint averaged`).

    from_fraction: only checkpoints at or after this fraction of the latest step count (0.5: the second half
    of the run), so a short run does not average in checkpoints from before its curve flattened.
    Returns (the steps averaged, the directory written); fewer than `last` checkpoints average what exists,
    with a warning.
    """
    if last < 1:
        raise ArgumentError(f"--last {last}: give how many checkpoints to average (1 or more).")
    if not 0.0 <= from_fraction <= 1.0:
        raise ArgumentError(f"--from-fraction {from_fraction}: give a fraction of the run in [0, 1].")
    available = kept_steps(workdir)
    first = from_fraction * available[-1] if available else 0.0
    steps = [step for step in available if step >= first][-last:]
    if len(steps) < last:
        logger.warning(
            "only %d checkpoints in %s at or after step %d; averaging %s.", len(steps), workdir, first, steps
        )
    return steps, save_named_params(workdir, "averaged", average_params(workdir, steps=steps), steps)


def save_named_params(workdir: str | Path, name: str, params: Any, steps: list[int]) -> Path:
    """Writes a named parameter set (NAMED_PARAMS) to {workdir}/{name}, and {name}.json with the steps it
    came from (none for imported parameters)."""
    if name not in NAMED_PARAMS:
        raise ValueError(f"name={name!r} is not one of {NAMED_PARAMS}.")
    directory = Path(workdir).absolute() / name
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(directory, {"params": params}, force=True)
    save_json(directory.with_suffix(".json"), {"steps": list(steps)})
    return directory


def restore_named_params(workdir: str | Path, name: str) -> Any:
    directory = Path(workdir).absolute() / name
    if not directory.is_dir():
        command = "average" if name == "averaged" else "import-torch"
        raise FileNotFoundError(f"{directory} not found: run `transformer-jax {command} --workdir {workdir}` first.")
    with ocp.StandardCheckpointer() as checkpointer:
        metadata = checkpointer.metadata(directory)
        tree = getattr(metadata, "item_metadata", metadata)  # StepMetadata -> the tree of array metadata
        return checkpointer.restore(directory, on_first_device(getattr(tree, "tree", tree)))["params"]
