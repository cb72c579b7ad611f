"""Orbax checkpoints of a training run, and loading a trained model from its workdir.

Layout of a workdir:

    {workdir}/config.json          resolved experiment config (model section complete: vocab and special ids)
    {workdir}/spm.model            the SentencePiece model (data/tokenizer.py)
    {workdir}/checkpoints/{step}/  state/ (TrainState: params, opt_state, step, rng, ...), data/ (iterator JSON)
    {workdir}/averaged/            params averaged over the last N checkpoints (`transformer-jax average`)
    {workdir}/imported/            params loaded from a torch state_dict (`transformer-jax import-torch`)

Saves are asynchronous (orbax writes in a background thread while training continues); the last `keep`
checkpoints are kept. Before anything is restored or overwritten, `check_compatible` compares the shapes of
the saved parameters with those the config asks for and names every difference.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import flax
import jax
import numpy as np
import orbax.checkpoint as ocp

logger = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
CONFIG_FILENAME = "config.json"
# Parameter sets stored beside the training checkpoints, selected by name instead of a step.
NAMED_PARAMS = ("averaged", "imported")


class CheckpointMismatchError(ValueError):
    """A saved checkpoint does not fit the configured model."""


class CheckpointDamagedError(ValueError):
    """A checkpoint's files cannot be read back (truncated, emptied or missing)."""


def _flat_shapes(tree: Any, prefix: str = "") -> dict[str, tuple[int, ...]]:
    """{'a/b/c': shape} for a nested dict whose leaves have `.shape` (arrays, ShapeDtypeStruct, metadata)."""
    out = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            out.update(_flat_shapes(value, f"{prefix}{key}/"))
    elif tree is not None:
        out[prefix.rstrip("/")] = tuple(getattr(tree, "shape", ()))
    return out


def describe_mismatch(saved: dict[str, tuple], wanted: dict[str, tuple]) -> list[str]:
    """Human-readable lines for every parameter missing, extra, or of a different shape."""
    lines = []
    for name in sorted(set(saved) | set(wanted)):
        if name not in saved:
            lines.append(f"  {name}: in the config {wanted[name]}, not in the checkpoint")
        elif name not in wanted:
            lines.append(f"  {name}: in the checkpoint {saved[name]}, not in the config")
        elif saved[name] != wanted[name]:
            lines.append(f"  {name}: checkpoint {saved[name]} vs config {wanted[name]}")
    return lines


class Checkpointer:
    """An orbax CheckpointManager over {workdir}/checkpoints with two items: 'state' and 'data' (JSON)."""

    def __init__(self, workdir: str | Path, *, keep: int | None = 5, async_save: bool = True):
        self.directory = Path(workdir).absolute() / CHECKPOINT_DIR
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=True,
            enable_async_checkpointing=async_save,
        )
        handlers = {"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()}
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def saved_param_shapes(self, step: int) -> dict[str, tuple[int, ...]]:
        metadata = self.manager.item_metadata(step)["state"]
        tree = getattr(metadata, "tree", metadata)
        return _flat_shapes(tree.get("params", {}))

    def check_compatible(self, step: int, abstract_state: Any) -> None:
        """Raises CheckpointMismatchError naming the parameters whose names/shapes differ."""
        wanted = _flat_shapes(flax.serialization.to_state_dict(abstract_state)["params"])
        saved = self.saved_param_shapes(step)
        lines = describe_mismatch(saved, wanted)
        if lines:
            raise CheckpointMismatchError(
                f"The checkpoint at {self.directory / str(step)} does not fit the configured model; "
                f"{len(lines)} parameter(s) differ:\n"
                + "\n".join(lines)
                + "\nUse the config it was trained with (see config.json in the workdir) or a fresh --workdir. "
                "Nothing was overwritten."
            )

    def save(self, step: int, state: Any, data_state: dict | None = None, *, wait: bool = False) -> None:
        """Starts an (async) save of the state and the data position at `step`."""
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(flax.serialization.to_state_dict(state)),
            data=ocp.args.JsonSave(data_state or {}),
        )
        self.manager.save(step, args=args, force=True)
        if wait:
            self.manager.wait_until_finished()

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        """(state, data_state) at `step`, placed like `abstract_state` (ShapeDtypeStructs with shardings)."""
        self.check_compatible(step, abstract_state)
        target = flax.serialization.to_state_dict(abstract_state)
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target),
                data=ocp.args.JsonRestore(),
            ),
        )
        state = flax.serialization.from_state_dict(abstract_state, restored["state"])
        return state, dict(restored["data"] or {})

    def restore_newest_intact(self, abstract_state: Any) -> tuple[int, Any, dict] | None:
        """(step, state, data_state) of the newest checkpoint that reads back, or None if there is none.

        A damaged newer checkpoint (a truncated array file, empty metadata, a missing directory) is skipped with
        a warning naming it; if every checkpoint is damaged, CheckpointDamagedError says so.
        """
        steps = sorted(self.all_steps(), reverse=True)
        for step in steps:
            try:
                state, data_state = self.restore(step, abstract_state)
            except CheckpointMismatchError:
                raise
            except Exception as error:  # noqa: BLE001 - orbax and tensorstore raise many types for bad files
                logger.warning(
                    "checkpoint %s is damaged (%s); falling back to an older one.",
                    self.directory / str(step),
                    _first_line(error),
                )
                continue
            if step != steps[0]:
                self._set_aside([newer for newer in steps if newer > step])
                logger.warning("resuming from checkpoint %d, the newest intact one.", step)
            return step, state, data_state
        if steps:
            raise CheckpointDamagedError(
                f"every checkpoint in {self.directory} ({steps}) is damaged; start a fresh "
                f"--workdir (or restore the directory from a backup)."
            )
        return None

    def _set_aside(self, steps: list[int]) -> None:
        """Renames damaged step directories to damaged_{step} (kept for inspection, out of orbax's way)."""
        if jax.process_index() == 0:
            for step in steps:
                source = self.directory / str(step)
                if source.exists():
                    target = self.directory / f"damaged_{step}"
                    source.rename(target)
                    logger.warning("moved the damaged checkpoint %s to %s.", source, target)
        self.manager.reload()

    def restore_params(self, step: int | None = None) -> Any:
        """The saved parameters as a nested dict of arrays on this process's first device.

        Whatever mesh wrote the checkpoint (8 devices with FSDP, say), the arrays are read onto one device, so
        inference and averaging work on any machine.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"No checkpoint in {self.directory}.")
        try:
            metadata = self.manager.item_metadata(step)["state"]
            target = on_first_device(getattr(metadata, "tree", metadata))
            restored = self.manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore())
            )
        except Exception as error:  # noqa: BLE001 - orbax and tensorstore raise many types for bad files
            others = [other for other in self.all_steps() if other != step]
            raise CheckpointDamagedError(
                f"checkpoint {step} in {self.directory} cannot be read ({_first_line(error)}); "
                + (
                    f"choose another with --checkpoint (available: {others})."
                    if others
                    else "no other checkpoint exists."
                )
            ) from None
        return restored["state"]["params"]

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:200] if text else ''}"


def on_first_device(metadata_tree: Any) -> Any:
    """A restore target from checkpoint metadata: every array whole on this process's first device.

    Restoring without a target makes orbax reuse the saved shardings, which only exist on the saving topology.
    """
    sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype, sharding=sharding),
        metadata_tree,
        is_leaf=lambda leaf: hasattr(leaf, "shape") and hasattr(leaf, "dtype"),
    )


def save_json(path: Path, value: dict) -> None:
    """Writes JSON atomically (a temporary file renamed over the old one)."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(value, indent=2, sort_keys=True, default=str))
    tmp.replace(path)


def save_config(workdir: str | Path, config: dict) -> None:
    save_json(Path(workdir) / CONFIG_FILENAME, config)


def load_config(workdir: str | Path) -> dict:
    path = Path(workdir) / CONFIG_FILENAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: is {workdir} the --workdir of a `transformer-jax train` run?")
    return json.loads(path.read_text())


def model_config_from_workdir(workdir: str | Path):
    """The ModelConfig a run in `workdir` trained (from config.json's complete model section)."""
    from transformer_jax.config import ModelConfig

    fields = dict(load_config(workdir)["model"])
    fields.pop("preset", None)
    return ModelConfig(**fields)


def load_params(workdir: str | Path, checkpoint: int | str | None = None) -> Any:
    """Parameters of a run: checkpoint None = the latest step, an int (or digits) = that step, or one of
    NAMED_PARAMS ('averaged' from `transformer-jax average`, 'imported' from `import-torch`)."""
    workdir = Path(workdir)
    if isinstance(checkpoint, str) and checkpoint in NAMED_PARAMS:
        return restore_named_params(workdir, checkpoint)
    if isinstance(checkpoint, str) and not checkpoint.isdigit():
        raise ValueError(
            f"checkpoint={checkpoint!r}: use a step number, one of {NAMED_PARAMS}, or nothing for the latest."
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
    if not (Path(workdir) / CHECKPOINT_DIR).is_dir():
        raise FileNotFoundError(
            f"{Path(workdir) / CHECKPOINT_DIR} not found: is {workdir} the --workdir of a `transformer-jax train` run?"
        )
    checkpointer = Checkpointer(workdir, keep=None, async_save=False)
    try:
        available = checkpointer.all_steps()
    finally:
        checkpointer.close()
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
