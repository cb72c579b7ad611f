"""A run's working directory: its layout, config.json, the resume policy, the trainer's lock, loading a
trained model, checkpoint averaging.

    {workdir}/config.json          resolved experiment config (model section complete: vocab and special ids)
    {workdir}/spm.model            the SentencePiece model (data/tokenizer.py)
    {workdir}/checkpoints/{step}/  state/ (TrainState: params, opt_state, step, rng, ...), data/ (iterator JSON)
    {workdir}/averaged/            params averaged over checkpoints: the last N or the best N by validation
                                   (`transformer-jax average`)
    {workdir}/imported/            params loaded from a torch state_dict (`transformer-jax import-torch`)
    {workdir}/metrics.jsonl, tensorboard/, curves.png    the training log (train/progress.py)
    {workdir}/train.lock           held by the trainer while it runs (`TrainerLock`)

The checkpoints themselves are checkpoint.py's (orbax).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import json
import logging
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from transformer_jax.checkpoint import CHECKPOINT_DIR, Checkpointer, on_first_device
from transformer_jax.config import ModelConfig
from transformer_jax.errors import UsageError, UserError
from transformer_jax.experiment import ConfigError, Experiment, OptimizerConfig
from transformer_jax.selection import BestMetric, best_steps, validation_scores
from transformer_jax.train.progress import read_metrics

logger = logging.getLogger(__name__)

CONFIG_FILENAME = "config.json"
LOCK_FILENAME = "train.lock"
# Parameter sets stored beside the training checkpoints, selected by name instead of a step.
NAMED_PARAMS = ("averaged", "imported")
BEST = "best"  # --checkpoint best: the kept checkpoint with the best validation metric
LATEST = "latest"  # --checkpoint latest: the newest checkpoint, as no --checkpoint


# ----------------------------------------------------------------------------------------------- config.json


def save_json(path: Path, value: dict) -> None:
    """Writes JSON atomically (a temporary file renamed over the old one)."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(value, indent=2, sort_keys=True, default=str))
    tmp.replace(path)


def save_config(workdir: str | Path, config: dict) -> None:
    save_json(Path(workdir) / CONFIG_FILENAME, config)


def load_config(workdir: str | Path) -> dict:
    """{workdir}/config.json in today's layout (`upgrade_config`)."""
    path = Path(workdir) / CONFIG_FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {workdir} the --workdir of a `transformer-jax train` run?")
    return upgrade_config(json.loads(path.read_text()))


def model_config_from_workdir(workdir: str | Path) -> ModelConfig:
    """The ModelConfig a run in `workdir` trained (from config.json's complete model section)."""
    return ModelConfig(**load_config(workdir)["model"])


def upgrade_config(values: Mapping[str, Any]) -> dict:
    """A config.json of any version in today's layout, so that older workdirs still replay and resume: version 0.1's
    one `train` section with the Adam fields and its model `preset` name, and a field added since is filled in with
    its default (a new field's default is what ran before it existed, e.g. key_dim None: d_model / num_heads)."""
    values = {name: dict(section) for name, section in values.items()}
    if "model" in values:
        values["model"].pop("preset", None)
    train = values.get("train", {})
    moved = {name: train.pop(name) for name in [f.name for f in dataclasses.fields(OptimizerConfig)] if name in train}
    if moved:
        values["optimizer"] = {**moved, **values.get("optimizer", {})}
    for name, defaults in Experiment().to_dict().items():
        if name in values:
            values[name] = {**defaults, **values[name]}
    return values


# ------------------------------------------------------------------------------------------- resume policy

# Fields a resumed run may not change: they define the model or the data stream the checkpoint continues.
RESUME_FIXED = (
    "model.",
    "data.source",
    "data.options.",
    "data.source_lang",
    "data.target_lang",
    "data.vocab_size",
    "data.tokenizer_",
    "data.tokens_per_batch",
    "data.max_len",
    "data.pack",
    "data.bucket_boundaries",
    "train.seed",
    "train.accum_steps",
)
# Fields under those prefixes that choose how the same numbers are computed, so a resumed run may change them.
RESUME_FREE = ("model.attention_impl",)


def _flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def resume_changes(saved: Mapping, new: Mapping) -> tuple[list[str], list[str]]:
    """(refused, allowed): 'field: old → new' lines between a workdir's config.json (`load_config`) and the new
    `to_dict()`.

    Refused changes alter the model or the data stream the checkpoint continues (RESUME_FIXED); the others
    (schedule, intervals, steps, budget, decoding, mesh, the attention kernel, ...) are allowed and reported.
    """
    old, updated = _flatten(saved), _flatten(new)
    refused: list[str] = []
    allowed: list[str] = []
    for field in sorted(set(old) | set(updated)):
        before, after = old.get(field, "(unset)"), updated.get(field, "(unset)")
        if before != after:
            line = f"{field}: {before!r} → {after!r}"
            fixed = field.startswith(RESUME_FIXED) and field not in RESUME_FREE
            (refused if fixed else allowed).append(line)
    return refused, allowed


def check_resumable(workdir: Path, resolved: dict) -> None:
    """Refuses a resume whose config changes the model or the data stream; reports the allowed changes."""
    if not (workdir / CONFIG_FILENAME).is_file():
        return
    refused, allowed = resume_changes(load_config(workdir), resolved)
    if refused:
        raise ConfigError(
            f"{workdir} holds a run whose checkpoint does not continue with this config; changed:\n  "
            + "\n  ".join(refused)
            + "\nUse the run's own settings (--config "
            f"{workdir / CONFIG_FILENAME} replays them) or a fresh --workdir. Nothing was changed."
        )
    if allowed:
        logger.warning("resuming with changed settings: %s", "; ".join(allowed))


# ------------------------------------------------------------------------------------------------ the lock


class WorkdirBusyError(UserError, RuntimeError):
    """Another trainer holds the workdir."""


class TrainerLock:
    """{workdir}/train.lock, held by one trainer for its whole run: a second trainer on the same workdir refuses
    before touching it, naming the holder.

    The lock is an exclusive `fcntl.flock`, which the operating system releases when its process ends however
    it ends, so a lock left by a killed trainer is stale by construction; the file's content (host, process id,
    start time) names the holder for the refusal. A clean exit removes the file; one left behind is reported when
    it is taken over.
    """

    def __init__(self, workdir: str | Path):
        self.path = Path(workdir) / LOCK_FILENAME
        self._fd: int | None = None

    def __enter__(self) -> TrainerLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise WorkdirBusyError(
                    f"{self.path.parent} is in use by another trainer ({self._holder() or 'holder unknown'}); wait "
                    f"for it to finish or stop it, or train in another --workdir. Nothing was changed."
                ) from None
            if self._is_current(fd):
                break
            os.close(fd)  # its holder removed the file between our open and our lock: take the new one
        self._fd = fd
        previous = self._holder()
        if previous:
            logger.warning("%s was left by a trainer that is gone (%s); taking it over.", self.path, previous)
        me = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.datetime.now().isoformat("T", "seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        return self

    def _is_current(self, fd: int) -> bool:
        """Whether the open file `fd` is still the one at self.path."""
        try:
            return os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def _holder(self) -> str:
        """'process P on host H since T' from the lock file, or '' if it is empty."""
        with contextlib.suppress(OSError, ValueError):
            holder = json.loads(self.path.read_text() or "null")
            if holder:
                return f"process {holder['pid']} on host {holder['host']} since {holder['since']}"
        return ""

    def __exit__(self, *exc) -> None:
        assert self._fd is not None
        self.path.unlink(missing_ok=True)  # released cleanly: no file left
        os.close(self._fd)  # releases the flock
        self._fd = None


# ------------------------------------------------------------------------------- trained models, averaging


def load_params(workdir: str | Path, checkpoint: int | str | None = None) -> Any:
    """Parameters of a run: checkpoint None or 'latest' = the latest step, an int (or digits) = that step, 'best' =
    the kept checkpoint with the best validation metric (the run's train.best_metric, selection.py), or one of
    NAMED_PARAMS ('averaged' from `transformer-jax average`, 'imported' from `import-torch`)."""
    workdir = Path(workdir)
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
    from transformer_jax.data.tokenizer import MODEL_FILENAME, Tokenizer

    workdir = Path(workdir)
    model_config = model_config_from_workdir(workdir)
    params = load_params(workdir, checkpoint)
    tokenizer = Tokenizer.from_bytes((workdir / MODEL_FILENAME).read_bytes())
    return model_config, params, tokenizer


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
    steps = best_steps(validation_scores(read_metrics(workdir), metric), available, k, metric)
    if not steps:
        raise FileNotFoundError(
            f"none of the checkpoints {available} in {workdir} has a validation {metric} in metrics.jsonl: the run "
            "validated at other steps. Train with train.eval_every (perplexity) or train.bleu_every (bleu) dividing "
            "train.checkpoint_every, or choose checkpoints by position (`average --last N`, a step number)."
        )
    return steps


def average_best(workdir: str | Path, best: int, metric: BestMetric) -> tuple[list[int], Path]:
    """Averages the `best` kept checkpoints with the best validation `metric` into {workdir}/averaged. Returns (the
    steps averaged, the directory written); fewer ranked checkpoints than `best` average what exists, with a
    warning."""
    if best < 1:
        raise ValueError(f"best={best}: average 1 or more of the best checkpoints.")
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
        raise ValueError(f"last={last}: average 1 or more of the latest checkpoints.")
    if not 0.0 <= from_fraction <= 1.0:
        raise ValueError(f"from_fraction={from_fraction}: give a fraction of the run in [0, 1].")
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
