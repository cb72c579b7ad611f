"""A run directory's config.json, the check before a command writes into it, and the resume policy: what a
training run opens (`open_for_training`: its checkpointer and the checkpoint it continues from)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformer_jax.checkpoint import Checkpointer
from transformer_jax.config import ModelConfig
from transformer_jax.errors import ConfigError
from transformer_jax.experiment import TrainConfig, upgrade_config
from transformer_jax.selection import BEST_METRICS

logger = logging.getLogger(__name__)

CONFIG_FILENAME = "config.json"


# ------------------------------------------------------------------------------------------------ the path


def check_workdir(workdir: str | Path) -> None:
    """Fails at once (OSError with the fix) on a remote URL, a path that is a file, or one we cannot write: a
    command that writes into a workdir calls it before any work."""
    if "://" in str(workdir):
        raise OSError(
            f"--workdir {workdir}: remote paths are not supported; use a local directory (e.g. a "
            f"mounted bucket) and copy the results."
        )
    path = Path(workdir)
    if path.exists() and not path.is_dir():
        raise OSError(f"--workdir {workdir} is a file, not a directory; pass a directory.")
    existing = path if path.exists() else next(parent for parent in path.absolute().parents if parent.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OSError(
            f"--workdir {workdir}: {existing} is not writable; fix its permissions or choose "
            f"another directory. Nothing was written."
        )


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


def open_for_training(
    workdir: Path, resolved: dict, train_cfg: TrainConfig, abstract_state: Any, *, write_config: bool
) -> tuple[Checkpointer, tuple | None]:
    """The run's checkpointer and what it continues from: (step, state, data position) of the newest intact
    checkpoint, None for a fresh run. A workdir's checkpoints are continued only by a config that continues them
    (`check_resumable`), checked before anything in it is overwritten; then config.json is written (`write_config`:
    process 0)."""
    checkpointer = Checkpointer(
        workdir,
        keep=train_cfg.keep_checkpoints,
        async_save=train_cfg.async_checkpoints,
        keep_best=train_cfg.keep_best,
        best_metric=train_cfg.best_metric,
        best_mode=BEST_METRICS[train_cfg.best_metric][2],
    )
    try:
        restored = None
        if checkpointer.latest_step() is not None:
            check_resumable(workdir, resolved)
            restored = checkpointer.restore_newest_intact(abstract_state)
        if write_config:
            save_config(workdir, resolved)
    except BaseException:
        checkpointer.close()
        raise
    return checkpointer, restored
