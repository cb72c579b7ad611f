"""The training runner: experiment -> tokenizer -> batches -> steps -> logs, validation and checkpoints.

    summary = train(experiment, workdir)        # experiment: transformer_jax.experiment.Experiment

`prepare(experiment, workdir)` does everything before the first step and returns a `Run` (tokenizer, model,
mesh, compiled functions, batches, checkpointer, the state to start from); `Loop(run, log).run()` drives it.

Restarting in the same workdir resumes from the latest checkpoint: same SentencePiece model, same state, same
position in the data. SIGTERM / SIGINT save a checkpoint within a step or two and return cleanly.

Steps are dispatched asynchronously, at most MAX_IN_FLIGHT ahead of the device: after dispatching a step the loop
waits for the metrics of the one before, so the host prepares the next batch while the device works, the
progress bar counts finished updates and a stop request is served at once.

Several processes (transformer_jax.distributed) all run `train` with the same experiment: each reads its own rows
of every batch; process 0 trains the tokenizer and alone writes config.json, metrics.jsonl, TensorBoard and the plot.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from transformer_jax import checkpoint as ckpt
from transformer_jax import distributed, parallel
from transformer_jax.accounting import count_parameters
from transformer_jax.config import ModelConfig
from transformer_jax.experiment import ConfigError, Experiment, OptimizerConfig, resume_changes
from transformer_jax.model import Transformer
from transformer_jax.train.optimizer import make_optimizer
from transformer_jax.train.progress import (
    ProgressLog,
    plot_curves,
    summarize_train_metrics,
)
from transformer_jax.train.runner import make_runner
from transformer_jax.train.state import TrainState, state_initializer
from transformer_jax.train.step import (
    FAST_COMPILE_OPTIONS,
    jit_eval_step,
    make_eval_step,
)
from transformer_jax.train.validation import validation_bleu, validation_loss

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 2  # dispatched steps whose metrics have not been fetched


class _Compiled(NamedTuple):
    init: Callable  # rng -> TrainState on the mesh
    train_step: Callable  # (state, global batch) -> (state, metrics), of the mesh's mode
    eval_step: Callable
    abstract: Any  # the TrainState as ShapeDtypeStructs with shardings (the restore target)


@functools.lru_cache(maxsize=8)
def _compiled_functions(
    model_cfg: ModelConfig,
    optimizer: OptimizerConfig,
    label_smoothing: float,
    accum_steps: int,
    mesh: jax.sharding.Mesh,
    rules: tuple,
    mode: str,
    fast_compile: bool,
    dropout_prng: str,
) -> _Compiled:
    """Jitted init / train / eval functions, cached so that a second run in one process reuses compilations."""
    tx, schedule = make_optimizer(optimizer, model_cfg.d_model)
    model = Transformer(model_cfg)
    options = FAST_COMPILE_OPTIONS if fast_compile else None
    init, shardings, abstract = state_initializer(model_cfg, tx, mesh, rules, accum_steps, options)
    train_step = make_runner(
        mode,
        model,
        tx,
        schedule,
        label_smoothing=label_smoothing,
        accum_steps=accum_steps,
        mesh=mesh,
        state_shardings=shardings,
        rules=rules,
        compiler_options=options,
        dropout_prng=dropout_prng,
    )
    eval_step = jit_eval_step(
        make_eval_step(model, label_smoothing=label_smoothing), shardings.params, mesh, rules, options
    )
    return _Compiled(init, train_step, eval_step, abstract)


def _shared_tokenizer(workdir: Path, source, experiment: Experiment):
    """Process 0 loads or trains {workdir}/spm.model; other processes wait for it, then load it."""
    from transformer_jax.data.tokenizer import (
        MODEL_FILENAME,
        Tokenizer,
        load_or_train_tokenizer,
    )

    data = experiment.data
    if jax.process_index() == 0:
        tokenizer = load_or_train_tokenizer(
            workdir,
            source.pairs("train"),
            data.vocab_size,
            model_type=data.tokenizer_model_type,
            normalization=data.tokenizer_normalization,
            max_sentences=data.tokenizer_max_sentences,
            seed=experiment.train.seed,
        )
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("transformer_jax: tokenizer ready")
    if jax.process_index() != 0:
        path = workdir / MODEL_FILENAME
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found on process {jax.process_index()} after process 0 wrote it: "
                f"the workdir must be on a filesystem that every process shares."
            )
        tokenizer = Tokenizer.from_bytes(path.read_bytes())
    return tokenizer


@dataclasses.dataclass
class Run:
    """Everything a training loop needs, made by `prepare`; `state` / `micro_step` are where it starts."""

    experiment: Experiment
    workdir: Path
    model: ModelConfig  # the experiment's model with the tokenizer's vocabulary size and special ids
    tokenizer: Any
    mesh: jax.sharding.Mesh
    rules: tuple
    shard: tuple[int, int]  # (this process's index, count) of the data shards
    compiled: _Compiled
    checkpointer: ckpt.Checkpointer
    batches: Any  # data.batching.TrainBatches
    valid: list  # validation batches
    valid_pairs: list  # raw validation text pairs (BLEU scores detokenized output against them)
    state: TrainState  # on the mesh
    micro_step: int
    started: float  # time.perf_counter() at the start of `train`
    timings: dict  # seconds of each part of the set-up


def prepare(experiment: Experiment, workdir: str | Path, started: float | None = None) -> Run:
    """The set-up of a run, cheapest checks first: data, mesh, tokenizer, model, compiled functions, checkpoint
    (restored when the workdir has one), batches. The caller closes `run.checkpointer`."""
    from transformer_jax.data.batching import TrainBatches, eval_batches
    from transformer_jax.data.sources import check_splits_not_empty, source_from_config

    started = time.perf_counter() if started is None else started
    distributed.initialize(experiment.distributed)  # before any other JAX call
    data, train = experiment.data, experiment.train
    workdir = Path(workdir)
    source = source_from_config(data)
    check_splits_not_empty(source)
    try:
        mesh = parallel.make_mesh(experiment.mesh.shape)
        rules = tuple(parallel.rules_from_config(experiment.mesh, mesh))
    except ValueError as error:
        raise ConfigError(f"mesh section: {error}") from None
    batch_axes = mesh.shape["data"] * mesh.shape["fsdp"]
    if data.eval_batch_size % batch_axes:
        raise ConfigError(
            f"data.eval_batch_size={data.eval_batch_size} must be a multiple of the data x fsdp mesh size {batch_axes}."
        )

    workdir.mkdir(parents=True, exist_ok=True)
    timings = {"setup": time.perf_counter() - started}
    tokenizer = _shared_tokenizer(workdir, source, experiment)
    model_cfg = experiment.model.replace(
        vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id
    )
    try:
        parallel.check_model_fits_mesh(model_cfg, mesh, rules)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    timings["tokenizer"] = time.perf_counter() - started - sum(timings.values())
    compiled = _compiled_functions(
        model_cfg,
        experiment.optimizer,
        train.label_smoothing,
        train.accum_steps,
        mesh,
        rules,
        experiment.mesh.mode,
        train.fast_compile,
        train.dropout_prng,
    )

    is_main = jax.process_index() == 0
    checkpointer = ckpt.Checkpointer(workdir, keep=train.keep_checkpoints, async_save=train.async_checkpoints)
    try:
        resolved = experiment.replace(model=model_cfg).to_dict()
        restored = None
        if checkpointer.latest_step() is not None:  # before anything in the workdir is overwritten
            _check_resumable(workdir, resolved)
            restored = checkpointer.restore_newest_intact(compiled.abstract)
        if is_main:
            ckpt.save_config(workdir, resolved)

        shard = parallel.data_shard(mesh, rules)
        boundaries = tuple(data.bucket_boundaries) or None
        special_ids = dict(pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)
        batches = TrainBatches(
            tokenizer.encode_pairs(source.pairs("train")),
            tokens_per_batch=data.tokens_per_batch,
            max_len=data.max_len,
            seed=train.seed,
            bucket_boundaries=boundaries,
            batch_multiple=batch_axes,
            pack=data.pack,
            shard_index=shard[0],
            shard_count=shard[1],
            **special_ids,
        )
        valid_pairs = list(source.pairs("validation"))
        valid = [
            batch
            for _, batch in eval_batches(
                tokenizer.encode_pairs(valid_pairs),
                batch_size=data.eval_batch_size,
                max_len=data.max_len,
                bucket_boundaries=boundaries,
                **special_ids,
            )
        ]
        if data.max_eval_batches:
            valid = valid[: data.max_eval_batches]

        skipped = {
            split: counts for split, counts in getattr(source, "skipped", {}).items() if counts.empty or counts.too_long
        }
        if skipped and is_main:
            print(
                "skipped pairs: "
                + "; ".join(
                    f"{split} {c.empty} empty, {c.too_long} too long (kept {c.kept})" for split, c in skipped.items()
                ),
                flush=True,
            )
        timings["data"] = time.perf_counter() - started - sum(timings.values())
        if restored is not None:
            latest, state, data_state = restored
            batches.restore(data_state["batches"])
            logger.info("Resumed from %s at update %d.", checkpointer.directory / str(latest), latest)
        else:
            state = compiled.init(jax.random.PRNGKey(train.seed))
        micro_step = int(jax.device_get(state.step))
        return Run(
            experiment=experiment,
            workdir=workdir,
            model=model_cfg,
            tokenizer=tokenizer,
            mesh=mesh,
            rules=rules,
            shard=shard,
            compiled=compiled,
            checkpointer=checkpointer,
            batches=batches,
            valid=valid,
            valid_pairs=valid_pairs,
            state=state,
            micro_step=micro_step,
            started=started,
            timings=timings,
        )
    except BaseException:
        checkpointer.close()
        raise


def train(experiment: Experiment, workdir: str | Path, on_update: Callable[[int, dict], None] | None = None) -> dict:
    """Trains (or resumes) `experiment` in `workdir`. Returns a summary of the run.

    on_update(update, metrics): optional hook called when an update has finished on the device, with its metrics
    on the host (the loop is then at most MAX_IN_FLIGHT - 1 steps further).
    """
    run = prepare(experiment, workdir)
    is_main = jax.process_index() == 0
    try:
        accum = experiment.train.accum_steps
        total = None if experiment.train.max_minutes else experiment.train.steps  # a budget stops when time is up
        log = ProgressLog(
            run.workdir, run.micro_step // accum, total, experiment.train.progress, write=is_main, started=run.started
        )
        try:
            summary = Loop(run, log, on_update).run()
        finally:
            log.close()
    finally:
        run.checkpointer.close()
    plot = plot_curves(run.workdir) if is_main else None
    summary["plot"] = str(plot) if plot else None
    return summary


def _check_resumable(workdir: Path, resolved: dict) -> None:
    """Refuses a resume whose config changes the model or the data stream; reports the allowed changes."""
    if not (workdir / ckpt.CONFIG_FILENAME).is_file():
        return
    refused, allowed = resume_changes(ckpt.load_config(workdir), resolved)
    if refused:
        raise ConfigError(
            f"{workdir} holds a run whose checkpoint does not continue with this config; changed:\n  "
            + "\n  ".join(refused)
            + "\nUse the run's own settings (--config "
            f"{workdir / ckpt.CONFIG_FILENAME} replays them) or a fresh --workdir. Nothing was changed."
        )
    if allowed:
        logger.warning("resuming with changed settings: %s", "; ".join(allowed))


class _StopRequest:
    """SIGTERM / SIGINT set a flag that the loop checks between steps; a second SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        logger.warning("%s received: saving a checkpoint and stopping (Ctrl-C again to abort).", self.signal_name)

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


class _TimeBudget:
    """train.max_minutes (0 = none), counted from the start of `train`: tokenizer, compiling and validation included.

    With several processes, process 0's clock decides and the decision is broadcast at log_every boundaries,
    so every process stops at the same update.
    """

    def __init__(self, max_minutes: float, started: float, check_every: int = 1):
        self.deadline = started + 60.0 * max_minutes if max_minutes else None
        self.check_every = check_every if jax.process_count() > 1 else 1
        self.stopped = False

    def spent(self, update: int) -> bool:
        if self.deadline is None or update % self.check_every:
            return False
        over = time.perf_counter() >= self.deadline
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            over = bool(multihost_utils.broadcast_one_to_all(np.array(over)))
        self.stopped = over
        return over


class _InFlight(NamedTuple):
    micro_step: int  # train_step calls done once this one has finished
    metrics: dict  # device arrays
    tokens: int  # non-pad source + target tokens of this process's rows


class Loop:
    """The update loop of a prepared `Run`: dispatch, finish (metrics, logs), validate, save."""

    def __init__(self, run: Run, log: ProgressLog, on_update: Callable[[int, dict], None] | None = None):
        self.train_cfg, self.decode_cfg = run.experiment.train, run.experiment.decode
        self.model_cfg, self.tokenizer, self.train_step, self.eval_step = (
            run.model,
            run.tokenizer,
            run.compiled.train_step,
            run.compiled.eval_step,
        )
        self.checkpointer, self.batches, self.valid, self.valid_pairs = (
            run.checkpointer,
            run.batches,
            run.valid,
            run.valid_pairs,
        )
        self.mesh, self.rules, self.shard, self.log, self.on_update = run.mesh, run.rules, run.shard, log, on_update
        self.state, self.micro_step, self.started, self.timings = run.state, run.micro_step, run.started, run.timings
        self.in_flight: collections.deque[_InFlight] = collections.deque()
        self.window: list[dict] = []  # host metrics of the micro-steps finished since the last train row
        self.update_metrics: list[dict] = []  # host metrics of the finished micro-steps of the current update
        self.window_tokens, self.window_start = 0, time.perf_counter()
        self.summary: dict[str, Any] = {"interrupted": None, "eval": None}

    def run(self) -> dict:
        train_cfg, accum = self.train_cfg, self.train_cfg.accum_steps
        started, timings = self.started, self.timings
        update = start = self.micro_step // accum
        self.summary["start_step"] = start
        dropped = self.batches.dropped
        self.log.message(
            f"model: {count_parameters(self.model_cfg).total:,} parameters, vocab "
            f"{self.model_cfg.vocab_size}; {'resuming at' if update else 'starting at'} update {update} "
            f"of {train_cfg.steps}" + (f"; {dropped} training pairs longer than max_len dropped" if dropped else "")
        )
        first_step_time = None
        last_saved = update if update else None
        budget = _TimeBudget(train_cfg.max_minutes, started, train_cfg.log_every)
        with _StopRequest() as stop:
            # A stop request is served at the next update boundary (the data position is saved per update).
            while update < train_cfg.steps and not (stop.signal_name and self.micro_step % accum == 0):
                if self.micro_step % accum == 0 and budget.spent(update):
                    self.summary["stopped_by"] = f"time budget train.max_minutes={train_cfg.max_minutes}"
                    self.log.message(f"time budget of {train_cfg.max_minutes} min reached at update {update}.")
                    break
                self._dispatch()
                if first_step_time is None:
                    self._drain()
                    first_step_time = time.perf_counter() - started
                    parts = dict(timings, **{"init/restore, compile, step": first_step_time - sum(timings.values())})
                    self.log.message(
                        f"time to first step: {first_step_time:.1f} s ("
                        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in parts.items())
                        + ")"
                    )
                    self.window_tokens, self.window_start = 0, time.perf_counter()
                while len(self.in_flight) >= MAX_IN_FLIGHT:
                    self._finish_oldest()
                if self.micro_step % accum:
                    continue
                update += 1
                self._validate(update)
                if update % train_cfg.checkpoint_every == 0 or update == train_cfg.steps:
                    self._save(update)
                    last_saved = update
            self._drain()
            if stop.signal_name:
                self.summary["interrupted"] = stop.signal_name
                if last_saved != update:
                    self._save(update, wait=True)
                    self.log.message(
                        f"{stop.signal_name}: saved a checkpoint at update {update}; run the same command to resume."
                    )
            if budget.stopped and update > start:
                if last_saved != update:
                    self._save(update, wait=True)
                self._validate(update, final=True)
        self.checkpointer.wait()
        finished = update == train_cfg.steps or budget.stopped
        if finished and update > start and train_cfg.final_bleu != "none":
            self._bleu(update, "final_bleu", train_cfg.final_bleu, self.valid_pairs)
        self.summary.update(step=update, time_to_first_step=first_step_time, timings=timings)
        return self.summary

    def _dispatch(self) -> None:
        """Queues one train step on the device (does not wait for it)."""
        batch = next(self.batches)
        tokens = int(np.count_nonzero(batch["inputs"]) + np.count_nonzero(batch["targets"]))
        self.state, metrics = self.train_step(self.state, parallel.global_batch(batch, self.mesh, self.rules))
        self.micro_step += 1
        self.in_flight.append(_InFlight(self.micro_step, metrics, tokens))

    def _drain(self) -> None:
        while self.in_flight:
            self._finish_oldest()

    def _finish_oldest(self) -> None:
        """Waits for the oldest dispatched step; accounts its metrics, the progress bar, train rows, on_update."""
        done = self.in_flight.popleft()
        values = {key: float(value) for key, value in jax.device_get(done.metrics).items()}
        self.window.append(values)
        self.update_metrics.append(values)
        self.window_tokens += done.tokens
        if done.micro_step % self.train_cfg.accum_steps:
            return
        update = done.micro_step // self.train_cfg.accum_steps
        if update % self.train_cfg.log_every == 0 or update == self.train_cfg.steps:
            values = summarize_train_metrics(self.window)
            elapsed = max(time.perf_counter() - self.window_start, 1e-9)
            values["tokens_per_sec"] = self.window_tokens * self.shard[1] / elapsed  # all processes' rows
            self.log.log("train", update, values)
            self.log.progress(
                0,
                {
                    "loss": f"{values['loss']:.3f}",
                    "lr": f"{values['learning_rate']:.2e}",
                    "tok/s": f"{values['tokens_per_sec']:.0f}",
                },
            )
            self.summary["train"] = values
            self.window, self.window_tokens, self.window_start = [], 0, time.perf_counter()
        self.log.progress(1)
        if self.on_update is not None:
            self.on_update(update, summarize_train_metrics(self.update_metrics))
        self.update_metrics = []

    def _validate(self, update: int, final: bool = False) -> None:
        """Validation loss and periodic BLEU when due (loss always when `final`); their time is left out of tokens/s."""
        train_cfg = self.train_cfg
        loss_due = update % train_cfg.eval_every == 0 or update == train_cfg.steps
        if final:
            if update % train_cfg.eval_every == 0:
                return  # done at this update already
            loss_due = True
        bleu_due = bool(train_cfg.bleu_every) and update % train_cfg.bleu_every == 0
        if not (loss_due or bleu_due):
            return
        self._drain()
        began = time.perf_counter()
        if loss_due:
            metrics = validation_loss(self.eval_step, self._params(), self.valid, self.mesh, self.rules, self.shard)
            self.log.log("eval", update, metrics)
            self.log.message(
                f"update {update}: validation loss {metrics['loss']:.4f}, NLL {metrics['nll']:.4f}, "
                f"perplexity {metrics['perplexity']:.2f}, accuracy {metrics['accuracy']:.3f}"
            )
            self.summary["eval"] = metrics
        if bleu_due:
            self._bleu(update, "bleu", "greedy", self.valid_pairs[: train_cfg.bleu_max_sentences])
        self.window_start += time.perf_counter() - began

    def _bleu(self, update: int, kind: str, method: str, pairs) -> None:
        """Decodes `pairs` with `method`, logs BLEU / chrF as a `kind` row (process 0) and in the summary."""
        scores = validation_bleu(self.model_cfg, self._params(), self.tokenizer, pairs, self.decode_cfg, method)
        if scores is None:
            return
        values = {
            "bleu": scores.bleu,
            "bleu_lowercase": scores.bleu_lowercase,
            "chrf": scores.chrf,
            "sentences": scores.sentences,
        }
        self.log.log(kind, update, dict(values, method=method))
        self.log.message(
            f"update {update}: validation {method} BLEU {scores.bleu:.2f} (lowercased {scores.bleu_lowercase:.2f}), "
            f"chrF {scores.chrf:.2f} ({scores.sentences} sentences)"
        )
        self.summary[kind] = values

    def _params(self):
        return self.state.params

    def _save(self, update: int, wait: bool = False) -> None:
        self.checkpointer.save(
            update,
            self.state,
            {"batches": self.batches.state(), "micro_step": self.micro_step},
            wait=wait,
        )
