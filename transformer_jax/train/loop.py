"""The training loop: `assemble` builds a run from a few builders, `train` runs a loop that reads top to bottom.

    summary = train(experiment, workdir)        # experiment: transformer_jax.experiment.Experiment

`assemble(experiment, workdir)` does everything before the first step, cheapest checks first: the data source
(data/sources.py), where the arrays live (`sharding.make_layout`: mesh, rule table, this process's rows), the
workdir's lock, the tokenizer, the compiled steps (train/compiled.py), the checkpoint to continue from
(`workdir.open_for_training`), the batches (data/pipeline.py), and yields the `Trainer` they make. `train` runs its
loop with validation, checkpoints, logging, the time budget and stop signals as actions beside it
(train/actions.py); they see a `RunContext`, never the Trainer.

Restarting in the same workdir resumes from the latest checkpoint: same SentencePiece model, same state, same
position in the data. A workdir holding an imported model (`import-hf`) is fine-tuned: its tokenizer segments the
data and its parameters are the start. SIGTERM / SIGINT save a checkpoint within a step or two and return
cleanly. A trainer holds the workdir while it runs (`workdir.TrainerLock`): a second one refuses before touching it.

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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from transformer_jax import distributed, machine, peers, sharding
from transformer_jax.accounting import count_parameters
from transformer_jax.checkpoint import Checkpointer
from transformer_jax.config import ModelConfig
from transformer_jax.data.pipeline import RunData, build_run_data
from transformer_jax.data.prepared import check_prepared
from transformer_jax.data.sources import check_splits_not_empty, source_from_config
from transformer_jax.data.tokenizer import AnyTokenizer, load_or_train_shared_tokenizer
from transformer_jax.errors import ConfigError
from transformer_jax.experiment import Experiment
from transformer_jax.train.actions import (
    Checkpoints,
    FirstStepTime,
    PeriodicAction,
    RunContext,
    StopCondition,
    StopSignals,
    TimeBudget,
    TrainRows,
    Validation,
)
from transformer_jax.train.compiled import CompiledSteps, compiled_steps
from transformer_jax.train.progress import ProgressLog, plot_training_curves
from transformer_jax.train.validation import log_bleu, log_loss, validation_bleu, validation_loss
from transformer_jax.workdir import TrainerLock, open_for_training, restore_named_params

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 2  # dispatched steps whose metrics have not been fetched


def train(experiment: Experiment, workdir: str | Path, on_update: Callable[[int, dict], None] | None = None) -> dict:
    """Trains (or resumes) `experiment` in `workdir`. Returns a summary of the run.

    on_update(update, metrics): optional hook called when an update has finished on the device, with its metrics
    on the host (the loop is then at most MAX_IN_FLIGHT - 1 steps further).
    """
    with assemble(experiment, workdir, on_update) as trainer, StopSignals() as signals:
        steps, update = experiment.train.steps, trainer.start
        trainer.log.message(trainer.describe())
        ran_on = machine.describe()
        trainer.log.log("machine", update, ran_on)
        trainer.log.message("machine: " + ", ".join(f"{key} {value}" for key, value in ran_on.items()))
        run, rows = trainer.context(), trainer.rows
        actions: list[PeriodicAction] = [FirstStepTime(run, rows), Validation(run, rows), Checkpoints(run)]
        stops: list[StopCondition] = [signals, TimeBudget(run)]
        stopped_by = None
        directory = str(trainer.checkpointer.directory)
        peers.report_progress(lambda: (update, trainer.checkpointer.all_steps(), directory))
        try:
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
        except jax.errors.JaxRuntimeError as error:
            if peers.lost_a_peer(error):  # a collective failed: another process died or cannot be reached
                peers.end_after_failed_collective(error)
            raise
        finally:
            peers.report_progress(None)
        trainer.summary["step"] = update
    if jax.process_index() == 0:
        plot = plot_training_curves(trainer.workdir)
        trainer.summary["plot"] = str(plot) if plot else None
    return trainer.summary


@contextlib.contextmanager
def assemble(
    experiment: Experiment, workdir: str | Path, on_update: Callable[[int, dict], None] | None = None
) -> Iterator[Trainer]:
    """The Trainer of `experiment` in `workdir`, resumed from its newest intact checkpoint if it has one. Leaving
    the context closes the log and the checkpointer and releases the workdir."""
    laps = _Laps()
    distributed.initialize(experiment.distributed)  # before any other JAX call
    workdir, data_cfg, train_cfg = Path(workdir), experiment.data, experiment.train
    splits = ("validation",) if data_cfg.prepared else ("train", "validation")  # prepared: the text of train unread
    source = source_from_config(data_cfg, splits)
    check_splits_not_empty(source, splits)
    if data_cfg.prepared:
        check_prepared(data_cfg)  # complete and of this language pair, else named here, before any work
    try:  # the mesh, its rule table, this process's rows; the model must divide over them
        layout = sharding.make_layout(experiment.mesh.shape, experiment.mesh.rules, experiment.model)
    except ValueError as error:
        raise ConfigError(f"mesh section: {error}") from None
    if data_cfg.eval_batch_size % layout.batch_axes:
        raise ConfigError(
            f"data.eval_batch_size={data_cfg.eval_batch_size} must be a multiple of the data x fsdp mesh size "
            f"{layout.batch_axes}."
        )
    is_main = jax.process_index() == 0
    with contextlib.ExitStack() as stack:
        if is_main:  # one holder per run, before anything in the workdir is written
            stack.enter_context(TrainerLock(workdir))
        workdir.mkdir(parents=True, exist_ok=True)
        laps.lap("setup")
        tokenizer = load_or_train_shared_tokenizer(workdir, source, data_cfg, train_cfg.seed)
        if data_cfg.prepared:
            check_prepared(data_cfg, getattr(tokenizer, "fingerprint", "an imported Marian tokenizer"))
        model_cfg = tokenizer.model_config(experiment.model)  # its vocab_size is data.vocab_size, as checked above
        laps.lap("tokenizer")
        compiled = compiled_steps(model_cfg, experiment, layout.mesh, layout.rules)
        resolved = experiment.replace(model=model_cfg).to_dict()
        checkpointer, restored = open_for_training(
            workdir, resolved, train_cfg, compiled.abstract, write_config=is_main
        )
        stack.callback(checkpointer.close)
        data = build_run_data(
            source, tokenizer, data_cfg, train_cfg.seed, shard=layout.shard, batch_multiple=layout.batch_axes
        )
        if data.skipped and is_main:
            print("skipped pairs: " + "; ".join(f"{split} {counts}" for split, counts in data.skipped.items()))
        laps.lap("data")
        if restored is not None:
            latest, state, data_state = restored
            data.batches.restore(data_state["batches"])
            logger.info("Resumed from %s at update %d.", checkpointer.directory / str(latest), latest)
        else:
            state = _fresh_state(compiled, train_cfg.seed, workdir)
        start = int(jax.device_get(state.step)) // train_cfg.accum_steps
        total = None if train_cfg.max_minutes else train_cfg.steps  # a budget stops when time is up
        log = ProgressLog(workdir, start, total, train_cfg.progress, write=is_main, started=laps.started)
        stack.callback(log.close)
        summary: dict[str, Any] = {"interrupted": None, "eval": None, "start_step": start}
        rows = TrainRows(train_cfg, log, summary, checkpointer, layout.shard[1], on_update)
        yield Trainer(
            experiment, workdir, model_cfg, layout, tokenizer, data, compiled, checkpointer, state, log, rows, laps
        )


def _fresh_state(compiled: CompiledSteps, seed: int, workdir: Path) -> Any:
    """The state a run starts from: initialised, with the parameters of {workdir}/imported when the workdir holds
    an imported model (`import-hf`, `import-torch`), which the run then fine-tunes."""
    state = compiled.init(jax.random.PRNGKey(seed))
    if not (workdir / "imported").is_dir():
        return state
    imported = restore_named_params(workdir, "imported")
    logger.info("Starting from the imported parameters in %s.", workdir / "imported")
    shardings = jax.tree.map(lambda leaf: leaf.sharding, state.params)
    return state.replace(params=jax.device_put(imported, shardings))


class _Laps:
    """Seconds of each set-up phase, from the start of `assemble`."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def lap(self, name: str) -> None:
        self.seconds[name] = time.perf_counter() - self.started - sum(self.seconds.values())


class _InFlight(NamedTuple):
    micro_step: int  # train_step calls done once this one has finished
    metrics: dict  # device arrays
    tokens: int  # non-pad source + target tokens of this process's rows


class Trainer:
    """A run ready to step: the state on the mesh, the compiled steps, the batches, the checkpointer and the log
    (built by `assemble`). It dispatches updates, hands each finished step's metrics to the train rows, saves and
    validates."""

    def __init__(
        self,
        experiment: Experiment,
        workdir: Path,
        model_cfg: ModelConfig,
        layout: sharding.Layout,
        tokenizer: AnyTokenizer,
        data: RunData,
        compiled: CompiledSteps,
        checkpointer: Checkpointer,
        state: Any,
        log: ProgressLog,
        rows: TrainRows,
        laps: _Laps,
    ):
        self.experiment, self.workdir, self.model_cfg, self.layout = experiment, workdir, model_cfg, layout
        self.tokenizer, self.data, self.compiled, self.checkpointer = tokenizer, data, compiled, checkpointer
        self.state, self.log, self.rows, self.laps = state, log, rows, laps
        self.summary = rows.summary
        self.micro_step = int(jax.device_get(state.step))
        self.start = self.micro_step // experiment.train.accum_steps
        self.in_flight: collections.deque[_InFlight] = collections.deque()
        self.validated: dict[int, dict[str, float]] = {}  # update -> its validation metrics, saved with its checkpoint

    def context(self) -> RunContext:
        """What the actions beside the loop see of this run."""
        return RunContext(
            cfg=self.experiment.train,
            start=self.start,
            started=self.laps.started,
            timings=self.laps.seconds,
            log=self.log,
            summary=self.summary,
            checkpointer=self.checkpointer,
            drain=self.drain,
            save=self.save,
            validate=self.validate,
            final_bleu=lambda update, method: self.validation_bleu(update, "final_bleu", method, self.data.valid_pairs),
        )

    def describe(self) -> str:
        cfg, dropped = self.experiment.train, self.data.batches.dropped
        return (
            f"model: {count_parameters(self.model_cfg).total:,} parameters, vocab {self.model_cfg.vocab_size}; "
            f"{'resuming at' if self.start else 'starting at'} update {self.start} of {cfg.steps}"
            + (f"; {dropped} training pairs longer than max_len dropped" if dropped else "")
        )

    # ------------------------------------------------------------------------------------ the device side

    def dispatch_update(self) -> None:
        """Queues the micro-steps of one update, keeping at most MAX_IN_FLIGHT on the device."""
        for _ in range(self.experiment.train.accum_steps):
            batch = next(self.data.batches)
            tokens = int(np.count_nonzero(batch["inputs"]) + np.count_nonzero(batch["targets"]))
            placed = sharding.global_batch(batch, self.layout.mesh, self.layout.rules)
            self.state, metrics = self.compiled.train_step(self.state, placed)
            self.micro_step += 1
            self.in_flight.append(_InFlight(self.micro_step, metrics, tokens))
            while len(self.in_flight) >= MAX_IN_FLIGHT:
                self.finish_oldest()

    def finish_oldest(self) -> None:
        """Waits for the oldest dispatched step and hands its host metrics to the train rows."""
        done = self.in_flight.popleft()
        values = {key: float(value) for key, value in jax.device_get(done.metrics).items()}
        self.rows.finished(done.micro_step, values, done.tokens)

    def drain(self) -> None:
        while self.in_flight:
            self.finish_oldest()

    def save(self, update: int, wait: bool = False) -> None:
        """Checkpoints the state after `update`, once every dispatched step's metrics have been checked."""
        self.drain()
        data_position = {"batches": self.data.batches.state(), "micro_step": self.micro_step}
        self.checkpointer.save(update, self.state, data_position, metrics=self.validated.get(update), wait=wait)

    def validate(self, update: int, metric: str) -> None:
        """Validation `metric` at `update` unless it has been measured: 'perplexity' (the validation loss) or 'bleu'
        (greedy, the first train.bleu_max_sentences pairs; selection.py)."""
        if metric in self.validated.get(update, {}):
            return
        if metric == "perplexity":
            self.validation_loss(update)
        else:
            pairs = self.data.valid_pairs[: self.experiment.train.bleu_max_sentences]
            self.validation_bleu(update, "bleu", "greedy", pairs)

    def validation_loss(self, update: int) -> None:
        layout = self.layout
        metrics = validation_loss(
            self.compiled.eval_step, self.state.params, self.data.valid, layout.mesh, layout.rules, layout.shard
        )
        log_loss(self.log, update, metrics)
        self.validated.setdefault(update, {})["perplexity"] = metrics["perplexity"]
        self.summary["eval"] = metrics

    def validation_bleu(self, update: int, kind: str, method: str, pairs) -> None:
        """Decodes `pairs` with `method`, logs BLEU / chrF as a `kind` row (process 0) and in the summary."""
        decode_cfg = self.experiment.decode
        scores = validation_bleu(self.model_cfg, self.state.params, self.tokenizer, pairs, decode_cfg, method)
        if scores is None:
            return
        self.summary[kind] = log_bleu(self.log, kind, update, method, scores)
        if kind == "bleu":
            self.validated.setdefault(update, {})["bleu"] = scores.bleu
