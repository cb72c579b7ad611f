"""The training loop: a `Trainer` built once from the experiment, and a loop that reads top to bottom.

    summary = train(experiment, workdir)        # experiment: transformer_jax.experiment.Experiment

`Trainer(experiment, workdir)` does everything before the first step (tokenizer, model, mesh, compiled steps,
batches, the state to start from); `train` runs its loop, with validation, checkpoints, logging, the time budget
and stop signals as actions beside it (train/actions.py).

Restarting in the same workdir resumes from the latest checkpoint: same SentencePiece model, same state, same
position in the data. SIGTERM / SIGINT save a checkpoint within a step or two and return cleanly. A trainer holds
the workdir while it runs (`workdir.TrainerLock`): a second one refuses before touching it.

Steps are dispatched asynchronously, at most MAX_IN_FLIGHT ahead of the device: after dispatching a step the loop
waits for the metrics of the one before, so the host prepares the next batch while the device works, the
progress bar counts finished updates and a stop request is served at once.

Several processes (transformer_jax.distributed) all run `train` with the same experiment: each reads its own rows
of every batch; process 0 trains the tokenizer, holds the lock and alone writes config.json, metrics.jsonl,
TensorBoard and the plot.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from transformer_jax import checkpoint as ckpt
from transformer_jax import distributed, machine, parallel
from transformer_jax.accounting import count_parameters
from transformer_jax.experiment import ConfigError, Experiment
from transformer_jax.selection import BEST_METRICS
from transformer_jax.train.actions import (
    Checkpoints,
    FirstStepTime,
    PeriodicAction,
    StopCondition,
    StopSignals,
    TimeBudget,
    TrainRows,
    Validation,
)
from transformer_jax.train.progress import ProgressLog, plot_curves
from transformer_jax.train.runner import compiled_steps
from transformer_jax.train.validation import validation_bleu, validation_loss
from transformer_jax.workdir import TrainerLock, check_resumable, save_config

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 2  # dispatched steps whose metrics have not been fetched


def train(experiment: Experiment, workdir: str | Path, on_update: Callable[[int, dict], None] | None = None) -> dict:
    """Trains (or resumes) `experiment` in `workdir`. Returns a summary of the run.

    on_update(update, metrics): optional hook called when an update has finished on the device, with its metrics
    on the host (the loop is then at most MAX_IN_FLIGHT - 1 steps further).
    """
    with Trainer(experiment, workdir) as trainer, StopSignals() as signals:
        steps, update = experiment.train.steps, trainer.start
        trainer.log.message(trainer.describe())
        ran_on = machine.describe()
        trainer.log.log("machine", update, ran_on)
        trainer.log.message("machine: " + ", ".join(f"{key} {value}" for key, value in ran_on.items()))
        rows = trainer.train_rows = TrainRows(trainer, on_update)
        actions: list[PeriodicAction] = [FirstStepTime(trainer, rows), Validation(trainer, rows), Checkpoints(trainer)]
        stops: list[StopCondition] = [signals, TimeBudget(trainer)]
        stopped_by = None
        while update < steps:
            # A stop is served at an update boundary (the data position is saved per update).
            stopped_by = next((reason for stop in stops if (reason := stop.reason(update))), None)
            if stopped_by:
                break
            trainer.dispatch_update()
            update += 1
            for action in actions:
                action.after_update(update)
        trainer.drain()
        trainer.summary["interrupted"] = signals.signal_name
        for action in reversed(actions):  # the checkpoint first, then the final validation reads it
            action.at_end(update, stopped_by)
        trainer.summary["step"] = update
    if jax.process_index() == 0:
        plot = plot_curves(trainer.workdir)
        trainer.summary["plot"] = str(plot) if plot else None
    return trainer.summary


class _InFlight(NamedTuple):
    micro_step: int  # train_step calls done once this one has finished
    metrics: dict  # device arrays
    tokens: int  # non-pad source + target tokens of this process's rows


class Trainer:
    """Everything a run needs, built once, cheapest checks first: data, mesh, the workdir's lock, tokenizer,
    model, compiled steps, checkpoint (restored when the workdir has one), batches. A context manager: leaving
    it closes the log and the checkpointer and releases the workdir."""

    def __init__(self, experiment: Experiment, workdir: str | Path):
        from transformer_jax.data.batching import TrainBatches, eval_batches
        from transformer_jax.data.sources import check_splits_not_empty, source_from_config
        from transformer_jax.data.tokenizer import load_or_train_shared_tokenizer

        self.started = time.perf_counter()
        distributed.initialize(experiment.distributed)  # before any other JAX call
        self.experiment, self.workdir = experiment, Path(workdir)
        data, train_cfg = experiment.data, experiment.train
        source = source_from_config(data)
        check_splits_not_empty(source)
        try:
            self.mesh = parallel.make_mesh(experiment.mesh.shape)
            self.rules = tuple(parallel.rules_from_config(experiment.mesh, self.mesh))
        except ValueError as error:
            raise ConfigError(f"mesh section: {error}") from None
        batch_axes = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
        if data.eval_batch_size % batch_axes:
            raise ConfigError(
                f"data.eval_batch_size={data.eval_batch_size} must be a multiple of the data x fsdp mesh size "
                f"{batch_axes}."
            )
        is_main = jax.process_index() == 0
        self._exit = contextlib.ExitStack()
        if is_main:  # one holder per run, before anything in the workdir is written
            self._exit.enter_context(TrainerLock(self.workdir))
        try:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self.timings = {"setup": time.perf_counter() - self.started}
            self.tokenizer = load_or_train_shared_tokenizer(self.workdir, source, data, train_cfg.seed)
            self.model_cfg = experiment.model.replace(
                vocab_size=self.tokenizer.vocab_size,
                pad_id=self.tokenizer.pad_id,
                bos_id=self.tokenizer.bos_id,
                eos_id=self.tokenizer.eos_id,
            )
            try:
                parallel.check_model_fits_mesh(self.model_cfg, self.mesh, self.rules)
            except ValueError as error:
                raise ConfigError(str(error)) from None
            self._lap("tokenizer")
            self.compiled = compiled_steps(self.model_cfg, experiment, self.mesh, self.rules)

            self.checkpointer = ckpt.Checkpointer(
                self.workdir,
                keep=train_cfg.keep_checkpoints,
                async_save=train_cfg.async_checkpoints,
                keep_best=train_cfg.keep_best,
                best_metric=train_cfg.best_metric,
                best_mode=BEST_METRICS[train_cfg.best_metric][2],
            )
            self._exit.callback(self.checkpointer.close)
            resolved = experiment.replace(model=self.model_cfg).to_dict()
            restored = None
            if self.checkpointer.latest_step() is not None:  # before anything in the workdir is overwritten
                check_resumable(self.workdir, resolved)
                restored = self.checkpointer.restore_newest_intact(self.compiled.abstract)
            if is_main:
                save_config(self.workdir, resolved)

            self.shard = parallel.data_shard(self.mesh, self.rules)
            boundaries = tuple(data.bucket_boundaries) or None
            tokenizer = self.tokenizer
            special_ids = dict(pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)
            train = source.pairs("train")
            self.batches = TrainBatches(
                tokenizer.epoch_sampler(train, data.tokenizer_sampling, train_cfg.seed)
                if data.tokenizer_sampling
                else tokenizer.encode_pairs(train),
                tokens_per_batch=data.tokens_per_batch,
                max_len=data.max_len,
                seed=train_cfg.seed,
                bucket_boundaries=boundaries,
                batch_multiple=batch_axes,
                pack=data.pack,
                shard_index=self.shard[0],
                shard_count=self.shard[1],
                **special_ids,
            )
            self.valid_pairs = list(source.pairs("validation"))
            valid_ids = tokenizer.encode_pairs(self.valid_pairs)
            self.valid = [
                batch
                for _, batch in eval_batches(
                    valid_ids,
                    batch_size=data.eval_batch_size,
                    max_len=data.max_len,
                    bucket_boundaries=boundaries,
                    **special_ids,
                )
            ][: data.max_eval_batches or None]
            skipped = {split: c for split, c in getattr(source, "skipped", {}).items() if c.empty or c.too_long}
            if skipped and is_main:
                counts = (
                    f"{split} {c.empty} empty, {c.too_long} too long (kept {c.kept})" for split, c in skipped.items()
                )
                print("skipped pairs: " + "; ".join(counts), flush=True)
            self._lap("data")
            if restored is not None:
                latest, self.state, data_state = restored
                self.batches.restore(data_state["batches"])
                logger.info("Resumed from %s at update %d.", self.checkpointer.directory / str(latest), latest)
            else:
                self.state = self.compiled.init(jax.random.PRNGKey(train_cfg.seed))
            self.micro_step = int(jax.device_get(self.state.step))
            self.start = self.micro_step // train_cfg.accum_steps
            total = None if train_cfg.max_minutes else train_cfg.steps  # a budget stops when time is up
            self.log = ProgressLog(
                self.workdir, self.start, total, train_cfg.progress, write=is_main, started=self.started
            )
            self._exit.callback(self.log.close)
        except BaseException:
            self._exit.close()
            raise
        self.in_flight: collections.deque[_InFlight] = collections.deque()
        self.train_rows: TrainRows | None = None  # set by the loop: it consumes the finished steps' metrics
        self.summary: dict[str, Any] = {"interrupted": None, "eval": None, "start_step": self.start}
        self.validated: dict[int, dict[str, float]] = {}  # update -> its validation metrics, saved with its checkpoint

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc) -> None:
        self._exit.close()

    def _lap(self, name: str) -> None:
        self.timings[name] = time.perf_counter() - self.started - sum(self.timings.values())

    def describe(self) -> str:
        cfg, dropped = self.experiment.train, self.batches.dropped
        return (
            f"model: {count_parameters(self.model_cfg).total:,} parameters, vocab {self.model_cfg.vocab_size}; "
            f"{'resuming at' if self.start else 'starting at'} update {self.start} of {cfg.steps}"
            + (f"; {dropped} training pairs longer than max_len dropped" if dropped else "")
        )

    # ------------------------------------------------------------------------------------ the device side

    def dispatch_update(self) -> None:
        """Queues the micro-steps of one update, keeping at most MAX_IN_FLIGHT on the device."""
        for _ in range(self.experiment.train.accum_steps):
            batch = next(self.batches)
            tokens = int(np.count_nonzero(batch["inputs"]) + np.count_nonzero(batch["targets"]))
            placed = parallel.global_batch(batch, self.mesh, self.rules)
            self.state, metrics = self.compiled.train_step(self.state, placed)
            self.micro_step += 1
            self.in_flight.append(_InFlight(self.micro_step, metrics, tokens))
            while len(self.in_flight) >= MAX_IN_FLIGHT:
                self.finish_oldest()

    def finish_oldest(self) -> None:
        """Waits for the oldest dispatched step and hands its host metrics to the train rows."""
        done = self.in_flight.popleft()
        values = {key: float(value) for key, value in jax.device_get(done.metrics).items()}
        assert self.train_rows is not None
        self.train_rows.finished(done.micro_step, values, done.tokens)

    def drain(self) -> None:
        while self.in_flight:
            self.finish_oldest()

    def save(self, update: int, wait: bool = False) -> None:
        """Checkpoints the state after `update`, once every dispatched step's metrics have been checked."""
        self.drain()
        data_position = {"batches": self.batches.state(), "micro_step": self.micro_step}
        self.checkpointer.save(update, self.state, data_position, metrics=self.validated.get(update), wait=wait)

    def validate(self, update: int, metric: str) -> None:
        """Validation `metric` at `update` unless it has been measured: 'perplexity' (the validation loss) or 'bleu'
        (greedy, the first train.bleu_max_sentences pairs; selection.py)."""
        if metric in self.validated.get(update, {}):
            return
        if metric == "perplexity":
            self.validation_loss(update)
        else:
            pairs = self.valid_pairs[: self.experiment.train.bleu_max_sentences]
            self.validation_bleu(update, "bleu", "greedy", pairs)

    def validation_loss(self, update: int) -> None:
        metrics = validation_loss(
            self.compiled.eval_step, self.state.params, self.valid, self.mesh, self.rules, self.shard
        )
        self.log.log("eval", update, metrics)
        self.validated.setdefault(update, {})["perplexity"] = metrics["perplexity"]
        self.log.message(
            f"update {update}: validation loss {metrics['loss']:.4f}, NLL {metrics['nll']:.4f}, "
            f"perplexity {metrics['perplexity']:.2f}, accuracy {metrics['accuracy']:.3f}"
        )
        self.summary["eval"] = metrics

    def validation_bleu(self, update: int, kind: str, method: str, pairs) -> None:
        """Decodes `pairs` with `method`, logs BLEU / chrF as a `kind` row (process 0) and in the summary."""
        decode_cfg = self.experiment.decode
        scores = validation_bleu(self.model_cfg, self.state.params, self.tokenizer, pairs, decode_cfg, method)
        if scores is None:
            return
        values = {
            "bleu": scores.bleu,
            "bleu_lowercase": scores.bleu_lowercase,
            "chrf": scores.chrf,
            "sentences": scores.sentences,
        }
        self.log.log(kind, update, dict(values, method=method))
        if kind == "bleu":
            self.validated.setdefault(update, {})["bleu"] = scores.bleu
        self.log.message(
            f"update {update}: validation {method} BLEU {scores.bleu:.2f} (lowercased {scores.bleu_lowercase:.2f}), "
            f"chrF {scores.chrf:.2f} ({scores.sentences} sentences)"
        )
        self.summary[kind] = values
