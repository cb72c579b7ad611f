"""What runs beside the training loop (train/loop.py): periodic actions, and the conditions that stop it early.

An action's `after_update(update)` runs after each update is dispatched, `at_end(update, stopped_by)` once after
the loop (in reverse order, so the checkpoint is written before the final validation reads it). A stop
condition's `reason(update)` is None or why the run stops at this update boundary. They see a `RunContext` (the
run's settings, its log and summary, and what they may ask of it), never the trainer itself.

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

import dataclasses
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import jax
import numpy as np

from transformer_jax.checkpoint import Checkpointer
from transformer_jax.errors import UserError
from transformer_jax.experiment import TrainConfig
from transformer_jax.train.progress import ProgressLog, summarize_train_metrics

logger = logging.getLogger(__name__)

STOPPED_BY_SIGNAL = "signal"
STOPPED_BY_BUDGET = "budget"


class TrainingDivergedError(UserError, FloatingPointError):
    """The loss or the gradient norm of an update is NaN or infinite."""


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What the actions see of a run."""

    cfg: TrainConfig
    start: int  # the update this `train` command started (or resumed) at
    started: float  # time.perf_counter() when it began
    timings: dict[str, float]  # seconds of each set-up phase before the first step
    log: ProgressLog
    summary: dict[str, Any]  # what `train` returns; actions add their parts
    checkpointer: Checkpointer
    drain: Callable[[], None]  # wait for every dispatched step, its metrics checked
    save: Callable[..., None]  # save(update, wait=False): checkpoint the state after `update`
    validate: Callable[[int, str], None]  # validate(update, 'perplexity' | 'bleu'), once per update and metric
    final_bleu: Callable[[int, str], None]  # final_bleu(update, method): the whole validation split


class PeriodicAction(Protocol):
    def after_update(self, update: int) -> None: ...

    def at_end(self, update: int, stopped_by: str | None) -> None: ...


class StopCondition(Protocol):
    def reason(self, update: int) -> str | None: ...


class FirstStepTime:
    def __init__(self, run: RunContext, train_rows: TrainRows):
        self.run, self.train_rows = run, train_rows
        self.seconds: float | None = None

    def after_update(self, update: int) -> None:
        if self.seconds is not None:
            return
        self.run.drain()
        self.seconds = time.perf_counter() - self.run.started
        timings = self.run.timings
        parts = dict(timings, **{"init/restore, compile, step": self.seconds - sum(timings.values())})
        self.run.log.message(
            f"time to first step: {self.seconds:.1f} s ("
            + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in parts.items())
            + ")"
        )
        self.train_rows.restart_window()

    def at_end(self, update: int, stopped_by: str | None) -> None:
        self.run.summary.update(time_to_first_step=self.seconds, timings=self.run.timings)


class TrainRows:
    """Consumes the host metrics of finished micro-steps (`finished`, called by the trainer as each finishes).

    process_count: how many processes' rows each step trained on (tokens/s counts them all).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        log: ProgressLog,
        summary: dict[str, Any],
        checkpointer: Checkpointer,
        process_count: int,
        on_update: Callable[[int, dict], None] | None = None,
    ):
        self.cfg, self.log, self.summary, self.checkpointer = cfg, log, summary, checkpointer
        self.process_count, self.on_update = process_count, on_update
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
                f"and was stopped; its checkpoints ({self.checkpointer.all_steps()}) are untouched. Lower "
                "optimizer.lr_scale or raise optimizer.warmup_steps, then resume (or start a fresh --workdir)."
            )
        log = self.log
        if update % self.cfg.log_every == 0 or update == self.cfg.steps:
            row = summarize_train_metrics(self.window)
            elapsed = max(time.perf_counter() - self.window_start, 1e-9)
            row["tokens_per_sec"] = self.window_tokens * self.process_count / elapsed  # all processes' rows
            log.log("train", update, row)
            postfix = {"loss": f"{row['loss']:.3f}", "lr": f"{row['learning_rate']:.2e}"}
            log.progress(0, dict(postfix, **{"tok/s": f"{row['tokens_per_sec']:.0f}"}))
            self.summary["train"] = row
            self.restart_window()
        log.progress(1)
        if self.on_update is not None:
            self.on_update(update, this_update)


class Validation:
    def __init__(self, run: RunContext, train_rows: TrainRows):
        self.run, self.train_rows, self.cfg = run, train_rows, run.cfg

    def after_update(self, update: int) -> None:
        loss_due = update % self.cfg.eval_every == 0 or update == self.cfg.steps
        bleu_due = bool(self.cfg.bleu_every) and update % self.cfg.bleu_every == 0
        if loss_due or bleu_due:
            self._run(update, loss=loss_due, bleu=bleu_due)

    def at_end(self, update: int, stopped_by: str | None) -> None:
        if update == self.run.start:
            return
        if stopped_by == STOPPED_BY_BUDGET:  # run.validate skips a loss already measured at this update
            self._run(update, loss=True, bleu=False)
        if (update == self.cfg.steps or stopped_by == STOPPED_BY_BUDGET) and self.cfg.final_bleu != "none":
            self.run.final_bleu(update, self.cfg.final_bleu)

    def _run(self, update: int, *, loss: bool, bleu: bool) -> None:
        self.run.drain()
        began = time.perf_counter()
        for metric, due in (("perplexity", loss), ("bleu", bleu)):
            if due:
                self.run.validate(update, metric)
        self.train_rows.pause(time.perf_counter() - began)


class Checkpoints:
    def __init__(self, run: RunContext):
        self.run, self.cfg = run, run.cfg
        self.last_saved = run.start or None

    def after_update(self, update: int) -> None:
        if update % self.cfg.checkpoint_every == 0 or update == self.cfg.steps:
            self.run.save(update)
            self.last_saved = update

    def at_end(self, update: int, stopped_by: str | None) -> None:
        stopped_early = stopped_by == STOPPED_BY_SIGNAL or (stopped_by == STOPPED_BY_BUDGET and update > self.run.start)
        if stopped_early and self.last_saved != update:
            if stopped_by == STOPPED_BY_BUDGET and self.cfg.keep_best:  # the last checkpoint competes for the best
                self.run.validate(update, self.cfg.best_metric)
            self.run.save(update, wait=True)
            if stopped_by == STOPPED_BY_SIGNAL:
                self.run.log.message(
                    f"{self.run.summary['interrupted']}: saved a checkpoint at update {update}; run the same "
                    "command to resume."
                )
        self.run.checkpointer.wait()


class StopSignals:
    """SIGTERM / SIGINT stop the run at an update boundary; a second SIGINT interrupts at once.

    One process: a flag set by the handler, read between updates. Several processes: a signal to any one of them
    stops all of them at the same update, by JAX's preemption service (`multihost_utils.reached_preemption_sync_point`,
    as t5x and MaxText use it): its notifier, installed by `jax.distributed.initialize`, owns SIGTERM and tells every
    process; a SIGINT here is passed on to it as a SIGTERM. Every process then saves the same update's checkpoint.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}
        self._several = jax.process_count() > 1

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT,) if self._several else (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        if self._several:  # to the preemption notifier, which tells the other processes
            logger.warning("%s received: passed to every process as a preemption notice.", self.signal_name)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        logger.warning("%s received: saving a checkpoint and stopping (Ctrl-C again to abort).", self.signal_name)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def reason(self, update: int) -> str | None:
        if self._several:
            from jax.experimental import multihost_utils

            if not multihost_utils.reached_preemption_sync_point(update):
                return None
            self.signal_name = self.signal_name or "SIGTERM"
            logger.warning("%s on some process: every process saves update %d and stops.", self.signal_name, update)
            return STOPPED_BY_SIGNAL
        return None if self.signal_name is None else STOPPED_BY_SIGNAL


class TimeBudget:
    """train.max_minutes (0 = none), counted from the start of `train`: tokenizer, compiling and validation included.

    With several processes, process 0's clock decides and the decision is broadcast at log_every boundaries,
    so every process stops at the same update.
    """

    def __init__(self, run: RunContext):
        cfg = run.cfg
        self.run, self.max_minutes = run, cfg.max_minutes
        self.deadline = run.started + 60.0 * cfg.max_minutes if cfg.max_minutes else None
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
        self.run.summary["stopped_by"] = f"time budget train.max_minutes={self.max_minutes}"
        rate = (update - self.run.start) / self.max_minutes  # set-up, compiling and validation included
        self.run.summary["updates_per_minute"] = rate
        self.run.log.message(
            f"time budget of {self.max_minutes} min reached at update {update} ({rate:.1f} updates a minute)."
        )
        return STOPPED_BY_BUDGET
