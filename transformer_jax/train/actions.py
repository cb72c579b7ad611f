"""What runs beside the training loop (train/loop.py): periodic actions, and the conditions that stop it early.

An action's `after_update(update)` runs after each update is dispatched, `at_end(update, stopped_by)` once after
the loop (in reverse order, so the checkpoint is written before the final validation reads it). A stop
condition's `reason(update)` is None or why the run stops at this update boundary.

    FirstStepTime   drains the first update, logs the time to it (set-up, tokenizer, compiling) and restarts
                    the tokens/s window, so throughput leaves compilation out
    TrainRows       a train row (means since the last one) every train.log_every updates, the progress bar,
                    the caller's on_update hook; stops a run whose loss or gradient norm is not finite
    Validation      validation loss every train.eval_every updates, greedy BLEU every train.bleu_every; at the
                    end the loss of a run stopped by its budget and the final BLEU (train.final_bleu)
    Checkpoints     a checkpoint every train.checkpoint_every updates and at the last; at the end, one of a run
                    stopped early (by its budget: validated first under train.keep_best, so it can rank)
    StopSignals     SIGTERM / SIGINT (a second SIGINT interrupts at once)
    TimeBudget      train.max_minutes, counted from the start of `train`
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

import jax
import numpy as np

from transformer_jax.errors import UserError
from transformer_jax.train.progress import summarize_train_metrics

if TYPE_CHECKING:
    from transformer_jax.train.loop import Trainer

logger = logging.getLogger(__name__)

STOPPED_BY_SIGNAL = "signal"
STOPPED_BY_BUDGET = "budget"


class TrainingDivergedError(UserError, FloatingPointError):
    """The loss or the gradient norm of an update is NaN or infinite."""


class PeriodicAction(Protocol):
    def after_update(self, update: int) -> None: ...

    def at_end(self, update: int, stopped_by: str | None) -> None: ...


class StopCondition(Protocol):
    def reason(self, update: int) -> str | None: ...


class FirstStepTime:
    def __init__(self, trainer: Trainer, train_rows: TrainRows):
        self.trainer, self.train_rows = trainer, train_rows
        self.seconds: float | None = None

    def after_update(self, update: int) -> None:
        if self.seconds is not None:
            return
        self.trainer.drain()
        self.seconds = time.perf_counter() - self.trainer.started
        timings = self.trainer.timings
        parts = dict(timings, **{"init/restore, compile, step": self.seconds - sum(timings.values())})
        self.trainer.log.message(
            f"time to first step: {self.seconds:.1f} s ("
            + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in parts.items())
            + ")"
        )
        self.train_rows.restart_window()

    def at_end(self, update: int, stopped_by: str | None) -> None:
        self.trainer.summary.update(time_to_first_step=self.seconds, timings=self.trainer.timings)


class TrainRows:
    """Consumes the host metrics of finished micro-steps (`Trainer.finish_oldest` calls `finished`)."""

    def __init__(self, trainer: Trainer, on_update=None):
        self.trainer, self.on_update = trainer, on_update
        self.cfg = trainer.experiment.train
        self.window: list[dict] = []  # micro-steps finished since the last train row
        self.update_metrics: list[dict] = []  # finished micro-steps of the current update
        self.restart_window()

    def restart_window(self) -> None:
        self.window, self.window_tokens, self.window_start = [], 0, time.perf_counter()

    def pause(self, seconds: float) -> None:
        """Leaves `seconds` (validation) out of tokens/s."""
        self.window_start += seconds

    def finished(self, micro_step: int, values: dict, tokens: int) -> None:
        self.window.append(values)
        self.update_metrics.append(values)
        self.window_tokens += tokens
        if micro_step % self.cfg.accum_steps:
            return
        update = micro_step // self.cfg.accum_steps
        this_update = summarize_train_metrics(self.update_metrics)
        self.update_metrics = []
        if not (math.isfinite(this_update["loss"]) and math.isfinite(values["grad_norm"])):
            raise TrainingDivergedError(
                f"update {update}: loss {this_update['loss']}, gradient norm {values['grad_norm']}: the run diverged "
                f"and was stopped; its checkpoints ({self.trainer.checkpointer.all_steps()}) are untouched. Lower "
                "optimizer.lr_scale or raise optimizer.warmup_steps, then resume (or start a fresh --workdir)."
            )
        log = self.trainer.log
        if update % self.cfg.log_every == 0 or update == self.cfg.steps:
            row = summarize_train_metrics(self.window)
            elapsed = max(time.perf_counter() - self.window_start, 1e-9)
            row["tokens_per_sec"] = self.window_tokens * self.trainer.shard[1] / elapsed  # all processes' rows
            log.log("train", update, row)
            postfix = {"loss": f"{row['loss']:.3f}", "lr": f"{row['learning_rate']:.2e}"}
            log.progress(0, dict(postfix, **{"tok/s": f"{row['tokens_per_sec']:.0f}"}))
            self.trainer.summary["train"] = row
            self.restart_window()
        log.progress(1)
        if self.on_update is not None:
            self.on_update(update, this_update)


class Validation:
    def __init__(self, trainer: Trainer, train_rows: TrainRows):
        self.trainer, self.train_rows = trainer, train_rows
        self.cfg = trainer.experiment.train

    def after_update(self, update: int) -> None:
        loss_due = update % self.cfg.eval_every == 0 or update == self.cfg.steps
        bleu_due = bool(self.cfg.bleu_every) and update % self.cfg.bleu_every == 0
        if loss_due or bleu_due:
            self._run(update, loss=loss_due, bleu=bleu_due)

    def at_end(self, update: int, stopped_by: str | None) -> None:
        if update == self.trainer.start:
            return
        if stopped_by == STOPPED_BY_BUDGET:  # Trainer.validate skips a loss already measured at this update
            self._run(update, loss=True, bleu=False)
        if (update == self.cfg.steps or stopped_by == STOPPED_BY_BUDGET) and self.cfg.final_bleu != "none":
            self.trainer.validation_bleu(update, "final_bleu", self.cfg.final_bleu, self.trainer.valid_pairs)

    def _run(self, update: int, *, loss: bool, bleu: bool) -> None:
        self.trainer.drain()
        began = time.perf_counter()
        for metric, due in (("perplexity", loss), ("bleu", bleu)):
            if due:
                self.trainer.validate(update, metric)
        self.train_rows.pause(time.perf_counter() - began)


class Checkpoints:
    def __init__(self, trainer: Trainer):
        self.trainer, self.cfg = trainer, trainer.experiment.train
        self.last_saved = trainer.start or None

    def after_update(self, update: int) -> None:
        if update % self.cfg.checkpoint_every == 0 or update == self.cfg.steps:
            self.trainer.save(update)
            self.last_saved = update

    def at_end(self, update: int, stopped_by: str | None) -> None:
        stopped_early = stopped_by == STOPPED_BY_SIGNAL or (
            stopped_by == STOPPED_BY_BUDGET and update > self.trainer.start
        )
        if stopped_early and self.last_saved != update:
            if stopped_by == STOPPED_BY_BUDGET and self.cfg.keep_best:  # the last checkpoint competes for the best
                self.trainer.validate(update, self.cfg.best_metric)
            self.trainer.save(update, wait=True)
            if stopped_by == STOPPED_BY_SIGNAL:
                self.trainer.log.message(
                    f"{self.trainer.summary['interrupted']}: saved a checkpoint at update {update}; run the same "
                    "command to resume."
                )
        self.trainer.checkpointer.wait()


class StopSignals:
    """SIGTERM / SIGINT set a flag that the loop reads between updates; a second SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        logger.warning("%s received: saving a checkpoint and stopping (Ctrl-C again to abort).", self.signal_name)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def reason(self, update: int) -> str | None:
        return None if self.signal_name is None else STOPPED_BY_SIGNAL


class TimeBudget:
    """train.max_minutes (0 = none), counted from the start of `train`: tokenizer, compiling and validation included.

    With several processes, process 0's clock decides and the decision is broadcast at log_every boundaries,
    so every process stops at the same update.
    """

    def __init__(self, trainer: Trainer):
        cfg = trainer.experiment.train
        self.trainer, self.max_minutes = trainer, cfg.max_minutes
        self.deadline = trainer.started + 60.0 * cfg.max_minutes if cfg.max_minutes else None
        self.check_every = cfg.log_every if jax.process_count() > 1 else 1

    def reason(self, update: int) -> str | None:
        if self.deadline is None or update % self.check_every:
            return None
        over = time.perf_counter() >= self.deadline
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            over = bool(multihost_utils.broadcast_one_to_all(np.array(over)))
        if not over:
            return None
        self.trainer.summary["stopped_by"] = f"time budget train.max_minutes={self.max_minutes}"
        rate = (update - self.trainer.start) / self.max_minutes  # set-up, compiling and validation included
        self.trainer.summary["updates_per_minute"] = rate
        self.trainer.log.message(
            f"time budget of {self.max_minutes} min reached at update {update} ({rate:.1f} updates a minute)."
        )
        return STOPPED_BY_BUDGET
