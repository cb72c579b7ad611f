"""Orbax checkpoints of a training run: {workdir}/checkpoints/{step}/ holds state/ (TrainState: params,
opt_state, step, rng, ...) and data/ (the batch iterator's position, JSON); the rest of a workdir is workdir/'s.

Saves are asynchronous (orbax writes in a background thread while training continues); the last `keep`
checkpoints are kept, and with `keep_best` also the best by a validation metric (selection.py). Before anything is
restored or overwritten, `check_compatible` compares the shapes of the saved parameters with those the config asks
for and names every difference. A state whose parameters are not all finite is never saved (`NonFiniteStateError`),
so a diverged run cannot rotate good checkpoints out.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import flax
import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from transformer_jax.errors import UserError

logger = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"

# jax 0.12.1 deprecates constructing SingleDeviceSharding directly in favour of make_single_device_sharding.
_single_device_sharding = (
    getattr(jax.sharding, "make_single_device_sharding", None) or jax.sharding.SingleDeviceSharding
)


class CheckpointMismatchError(UserError, ValueError):
    """A saved checkpoint does not fit the configured model."""


class CheckpointDamagedError(UserError, ValueError):
    """A checkpoint's files cannot be read back (truncated, emptied or missing)."""


class NonFiniteStateError(UserError, FloatingPointError):
    """A state to save holds NaN or infinity."""


@jax.jit
def all_finite(tree: Any) -> jax.Array:
    """True when every floating-point entry of `tree` is finite (one reduction, wherever the arrays live)."""
    checks = [jnp.isfinite(leaf).all() for leaf in jax.tree.leaves(tree) if jnp.issubdtype(leaf.dtype, jnp.inexact)]
    return jnp.stack(checks).all() if checks else jnp.array(True)


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

    def __init__(
        self,
        workdir: str | Path,
        *,
        keep: int | None = 5,
        async_save: bool = True,
        keep_best: int = 0,
        best_metric: str = "perplexity",
        best_mode: str = "min",
    ):
        """keep: the latest checkpoints kept (None: all). keep_best: also keep this many of the checkpoints saved
        with `metrics` (save), the best by metrics[best_metric] (best_mode 'min' or 'max'; selection.py)."""
        self.directory = Path(workdir).absolute() / CHECKPOINT_DIR
        self.best_metric, self.keep_best = best_metric, keep_best
        policy, metric = None, None
        if keep_best and keep is not None:

            def metric(metrics: dict) -> float:
                return metrics[best_metric]

            policy = ocp.checkpoint_managers.AnyPreservationPolicy(
                [
                    ocp.checkpoint_managers.LatestN(n=keep),
                    ocp.checkpoint_managers.BestN(
                        get_metric_fn=metric,
                        reverse=best_mode == "min",  # BestN keeps the last n in this sort order
                        n=keep_best,
                        keep_checkpoints_without_metrics=False,
                    ),
                ]
            )
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None if policy else keep,
            preservation_policy=policy,
            # orbax writes a checkpoint's metrics to disk (and reads them back when a resumed run opens the
            # directory) only when best_fn is set; the policy above alone would forget them on resume.
            best_fn=metric,
            best_mode=best_mode,
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

    def save(
        self, step: int, state: Any, data_state: dict | None = None, *, metrics: dict | None = None, wait: bool = False
    ) -> None:
        """Starts an (async) save of the state and the data position at `step`; refuses a non-finite state.
        metrics: the validation at this step ({best_metric: value}), which keep_best ranks; None if there was none."""
        if not bool(all_finite(state)):
            raise NonFiniteStateError(
                f"update {step}: the parameters or optimizer state hold NaN or infinity (the run diverged); "
                f"not saved, so the checkpoints in {self.directory} ({self.all_steps()}) stay as they were."
            )
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(flax.serialization.to_state_dict(state)),
            data=ocp.args.JsonSave(data_state or {}),
        )
        if not self.keep_best or (metrics is not None and self.best_metric not in metrics):
            metrics = None
        self.manager.save(step, args=args, metrics=metrics, force=True)
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
    sharding = _single_device_sharding(jax.local_devices()[0])
    return jax.tree.map(
        lambda leaf: jax.ShapeDtypeStruct(tuple(leaf.shape), leaf.dtype, sharding=sharding),
        metadata_tree,
        is_leaf=lambda leaf: hasattr(leaf, "shape") and hasattr(leaf, "dtype"),
    )
