"""The training runner: config -> tokenizer -> batches -> jitted steps -> logs, evals and checkpoints.

    train(config, workdir) -> summary dict

An experiment config (experiments/*.py, `get_config()` -> ml_collections.ConfigDict) has four sections:

  model  preset name ('tiny' | 'base' | 'big') plus any ModelConfig fields as overrides; vocab_size and the
         special ids come from the trained SentencePiece model, never from here.
  data   source kind + options, SentencePiece vocab size, tokens per batch, max length, packing, eval sizes.
  train  steps (optimizer updates), schedule, Adam constants, label smoothing, seed, accumulation, clipping,
         intervals (log / eval / checkpoint), checkpoints kept.
  mesh   sizes of the ('data', 'fsdp', 'tensor') mesh axes (-1 = all remaining devices).

Restarting in the same workdir resumes from the latest checkpoint: same SentencePiece model, same state, same
position in the data. SIGTERM / SIGINT save a checkpoint and return cleanly.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import json
import logging
import math
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from transformer_jax import checkpoint as ckpt
from transformer_jax import parallel
from transformer_jax.config import PRESETS, ModelConfig
from transformer_jax.model import Transformer
from transformer_jax.train import loss as loss_lib
from transformer_jax.train.optimizer import make_optimizer
from transformer_jax.train.state import TrainState, count_params, state_initializer
from transformer_jax.train.step import FAST_COMPILE_OPTIONS, jit_eval_step, jit_train_step, make_eval_step, make_train_step

logger = logging.getLogger(__name__)

METRICS_FILENAME = "metrics.jsonl"
PLOT_FILENAME = "curves.png"
TENSORBOARD_DIR = "tensorboard"
# Fields of ModelConfig that the tokenizer decides.
TOKENIZER_FIELDS = ("vocab_size", "pad_id", "bos_id", "eos_id")
MODEL_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name not in TOKENIZER_FIELDS)
SOURCES_WITH_DIRECTORY = ("local", "multi30k")


class ConfigError(ValueError):
    """The experiment config is wrong; the message says which field and how to fix it."""


# ---------------------------------------------------------------------------------------------- config


def model_section(preset: str, **overrides) -> ml_collections.ConfigDict:
    """The `model` config section: a preset name plus ModelConfig fields that override it."""
    section = ml_collections.ConfigDict({"preset": preset})
    for name, value in overrides.items():
        section[name] = value
    return section


def default_config() -> ml_collections.ConfigDict:
    """Every field an experiment may set, with the paper's constants (§5.3, §5.4) as defaults."""
    config = ml_collections.ConfigDict()
    config.model = model_section("base")
    config.data = ml_collections.ConfigDict(dict(
        source="builtin",  # a kind of transformer_jax.data.sources.make_source: builtin | local | multi30k | tfds
        path="",  # directory of local/multi30k files, or tfds data_dir
        source_lang="en",
        target_lang="de",
        options=ml_collections.ConfigDict(),  # further keyword options of the source
        vocab_size=37000,  # shared SentencePiece vocabulary (§5.1)
        tokenizer_model_type="bpe",
        tokenizer_max_sentences=1_000_000,
        tokens_per_batch=25000,  # §5.1: about 25000 source + 25000 target tokens per batch
        max_len=256,
        pack=False,
        bucket_boundaries=(),  # () = data.batching.default_bucket_boundaries(max_len)
        eval_batch_size=64,
        max_eval_batches=0,  # 0 = the whole validation split
    ))
    config.train = ml_collections.ConfigDict(dict(
        steps=100_000,  # optimizer updates
        warmup_steps=4000,
        lr_scale=1.0,
        adam_b1=0.9,
        adam_b2=0.98,
        adam_eps=1e-9,
        label_smoothing=0.1,
        seed=0,
        accum_steps=1,  # micro-batches per update (each of data.tokens_per_batch tokens)
        clip_grad_norm=0.0,  # 0 = no clipping (the paper does not clip)
        log_every=100,
        eval_every=5000,
        checkpoint_every=5000,
        keep_checkpoints=5,
        async_checkpoints=True,
        progress=True,
        fast_compile=False,  # XLA optimization level 0: 2-3x faster CPU compiles, slower steps (tests, smoke runs)
    ))
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    return config


def load_config_file(path: str | Path) -> ml_collections.ConfigDict:
    """Runs `get_config()` of a Python config file and returns it locked (unknown fields are errors)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} not found; e.g. --config experiments/tiny.py")
    spec = importlib.util.spec_from_file_location(f"_experiment_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{path} has no get_config() function.")
    config = module.get_config()
    config.lock()
    return config


def _parse_value(text: str, current: Any, field: str) -> Any:
    if isinstance(current, bool):
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"--config.{field}={text!r}: expected true or false.")
    if isinstance(current, str):
        return text
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if current is None:
            return text
        raise ConfigError(f"--config.{field}={text!r}: expected a {type(current).__name__}.") from None
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(current, tuple) and isinstance(value, (list, tuple)):
        return tuple(value)
    if isinstance(current, tuple) and isinstance(value, (int, float)):
        return (value,)
    if current is not None and not isinstance(value, type(current)):
        raise ConfigError(f"--config.{field}={text!r}: expected a {type(current).__name__}, "
                          f"got a {type(value).__name__}.")
    return value


def apply_overrides(config: ml_collections.ConfigDict, overrides: Iterable[tuple[str, str]]) -> None:
    """Applies ('train.steps', '100') pairs. Unknown fields are errors that list the known ones.

    In `model`, any ModelConfig field may be set (it overrides the preset); in `data.options` any name.
    """
    for dotted, text in overrides:
        *parents, name = dotted.split(".")
        node = config
        for index, parent in enumerate(parents):
            if not isinstance(node, ml_collections.ConfigDict) or parent not in node:
                known = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
                raise ConfigError(f"--config.{dotted}: no section {'.'.join(parents[:index + 1])!r}; "
                                  f"known: {known}.")
            node = node[parent]
        if not isinstance(node, ml_collections.ConfigDict):
            raise ConfigError(f"--config.{dotted}: {'.'.join(parents)} is not a section.")
        open_section = parents == ["model"] or parents == ["data", "options"]
        if name in node:
            current = node[name]
        elif parents == ["model"] and name in MODEL_FIELDS:
            current = getattr(ModelConfig, name, None)
            current = current if isinstance(current, (bool, int, float, str)) else None
        elif parents == ["data", "options"]:
            current = None
        else:
            known = sorted(set(node.keys()) | (set(MODEL_FIELDS) if parents == ["model"] else set()))
            hint = (" (vocab_size and the special ids come from the SentencePiece model; set data.vocab_size)"
                    if parents == ["model"] and name in TOKENIZER_FIELDS else "")
            raise ConfigError(f"--config.{dotted}: unknown field {name!r}{hint}; known fields of "
                              f"{'.'.join(parents) or 'the config'}: {known}.")
        value = _parse_value(text, current, dotted)
        if open_section and name not in node:
            with node.unlocked():
                node[name] = value
        else:
            try:
                node[name] = value
            except TypeError as error:
                raise ConfigError(f"--config.{dotted}={text!r}: {error}") from None


def complete_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The config with every default field present (experiment files may set only what they change)."""
    merged = default_config()
    unknown = []

    def merge(into, values, prefix):
        for key, value in values.items():
            free = prefix in ("model.", "data.options.")
            if key not in into and not free:
                unknown.append(prefix + key)
            elif isinstance(value, (dict, ml_collections.ConfigDict)) and key in into and \
                    isinstance(into[key], ml_collections.ConfigDict) and prefix + key != "model":
                merge(into[key], value, f"{prefix}{key}.")
            else:
                into[key] = value

    merge(merged, config, "")
    if unknown:
        raise ConfigError(f"unknown config fields {unknown}; see transformer_jax.train.loop.default_config().")
    if "model" in config:
        merged.model = ml_collections.ConfigDict(config.model.to_dict() if hasattr(config.model, "to_dict")
                                                 else dict(config.model))
    merged.lock()
    return merged


def model_config(model: ml_collections.ConfigDict | dict, *, vocab_size: int, pad_id: int = 0, bos_id: int = 1,
                 eos_id: int = 2) -> ModelConfig:
    """ModelConfig = preset(**overrides) with the tokenizer's vocabulary size and special ids."""
    fields = dict(model.to_dict() if hasattr(model, "to_dict") else model)
    preset = fields.pop("preset", "base")
    if preset not in PRESETS:
        raise ConfigError(f"model.preset={preset!r} is unknown; use one of {sorted(PRESETS)}.")
    unknown = sorted(set(fields) - set(MODEL_FIELDS) - set(TOKENIZER_FIELDS))
    if unknown:
        raise ConfigError(f"model fields {unknown} are not ModelConfig fields; known: {sorted(MODEL_FIELDS)}.")
    for name in TOKENIZER_FIELDS:
        fields.pop(name, None)
    try:
        return PRESETS[preset](**fields, vocab_size=vocab_size, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id)
    except ValueError as error:
        raise ConfigError(f"model section: {error}") from error


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Cheap checks of everything that would otherwise fail after minutes of work."""
    from transformer_jax.data.sources import SOURCE_KINDS

    placeholder = model_config(config.model, vocab_size=max(config.data.vocab_size, 8))
    data, train = config.data, config.train
    if data.source not in SOURCE_KINDS:
        raise ConfigError(f"data.source={data.source!r} is unknown; use one of {sorted(SOURCE_KINDS)}.")
    if data.source in SOURCES_WITH_DIRECTORY:
        if not data.path:
            raise ConfigError(f"data.source={data.source!r} needs the directory of its files: "
                              f"--config.data.path=/path/to/dir (e.g. ../shared/data/multi30k).")
        if not Path(data.path).is_dir():
            raise ConfigError(f"data.path={data.path!r} is not a directory.")
    positive = {"data.vocab_size": data.vocab_size, "data.tokens_per_batch": data.tokens_per_batch,
                "data.max_len": data.max_len, "data.eval_batch_size": data.eval_batch_size,
                "train.steps": train.steps, "train.warmup_steps": train.warmup_steps,
                "train.accum_steps": train.accum_steps, "train.log_every": train.log_every,
                "train.eval_every": train.eval_every, "train.checkpoint_every": train.checkpoint_every,
                "train.keep_checkpoints": train.keep_checkpoints}
    for name, value in positive.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{name}={value!r} must be a positive integer.")
    if not 0.0 <= train.label_smoothing < 1.0:
        raise ConfigError(f"train.label_smoothing={train.label_smoothing} must lie in [0, 1).")
    if train.lr_scale <= 0:
        raise ConfigError(f"train.lr_scale={train.lr_scale} must be positive.")
    if data.max_len > placeholder.max_len:
        raise ConfigError(f"data.max_len={data.max_len} exceeds the model's max_len={placeholder.max_len} "
                          f"(positions table); raise --config.model.max_len or lower data.max_len.")


def resolved_config_dict(config: ml_collections.ConfigDict, model_cfg: ModelConfig) -> dict:
    """The config as JSON-able dict, with the model section complete (preset + every ModelConfig field)."""
    out = json.loads(json.dumps(config.to_dict(), default=list))
    model = {f.name: getattr(model_cfg, f.name) for f in dataclasses.fields(ModelConfig)}
    model["dtype"], model["param_dtype"] = str(jnp.dtype(model_cfg.dtype)), str(jnp.dtype(model_cfg.param_dtype))
    out["model"] = {"preset": config.model.get("preset", "base"), **model}
    return out


# ---------------------------------------------------------------------------------------------- data


def make_source_from_config(data: ml_collections.ConfigDict):
    from transformer_jax.data.sources import make_source

    options = dict(data.options.to_dict()) if data.options else {}
    if data.source in SOURCES_WITH_DIRECTORY:
        options.setdefault("directory", data.path)
    if data.source == "tfds" and data.path:
        options.setdefault("data_dir", data.path)
    if data.source != "builtin":
        options.setdefault("source_lang", data.source_lang)
        options.setdefault("target_lang", data.target_lang)
    source = make_source(data.source, **options)
    if data.source in SOURCES_WITH_DIRECTORY:  # fail now, naming the missing file, not after tokenizer training
        for split in ("train", "validation"):
            for lang in (source.source_lang, source.target_lang):
                source.path(split, lang)
    return source


def encode_pairs(tokenizer, pairs) -> list[tuple[list[int], list[int]]]:
    sources, targets = zip(*pairs) if pairs else ((), ())
    encode = tokenizer.processor.encode
    return list(zip(encode(list(sources)), encode(list(targets))))


# ---------------------------------------------------------------------------------------------- steps


@functools.lru_cache(maxsize=8)
def _compiled_functions(model_cfg: ModelConfig, optimizer_key: tuple, label_smoothing: float, accum_steps: int,
                        mesh: jax.sharding.Mesh, rules: tuple, fast_compile: bool = False):
    """Jitted init / train / eval functions, cached so that a second run in one process reuses compilations."""
    train_cfg = ml_collections.ConfigDict(dict(optimizer_key))
    tx, schedule = make_optimizer(train_cfg, model_cfg.d_model)
    model = Transformer(model_cfg)
    options = FAST_COMPILE_OPTIONS if fast_compile else None
    jit_init, shardings, abstract = state_initializer(model_cfg, tx, mesh, rules, accum_steps, options)
    train_step = jit_train_step(make_train_step(model, tx, schedule, label_smoothing=label_smoothing,
                                                accum_steps=accum_steps), shardings, mesh, rules, options)
    eval_step = jit_eval_step(make_eval_step(model, label_smoothing=label_smoothing), shardings.params, mesh, rules,
                              options)
    return jit_init, train_step, eval_step, abstract, schedule


OPTIMIZER_FIELDS = ("warmup_steps", "lr_scale", "adam_b1", "adam_b2", "adam_eps", "clip_grad_norm")


def evaluate(eval_step, params, batches: Sequence[dict], mesh, rules=parallel.DEFAULT_RULES) -> dict:
    """Token-weighted means over all validation batches (loss, nll, perplexity, accuracy)."""
    totals = {"loss": 0.0, "nll": 0.0, "correct": 0.0, "tokens": 0.0}
    outputs = [eval_step(params, parallel.shard_batch(batch, mesh, rules)) for batch in batches]
    for sums in jax.device_get(outputs):
        for key in totals:
            totals[key] += float(sums[key])
    return loss_lib.summarize(totals)


# ---------------------------------------------------------------------------------------------- logging


class _StopRequest:
    """SIGTERM / SIGINT set a flag that the loop checks between steps; a second SIGINT interrupts at once."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous = {}

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


def read_metrics(workdir: str | Path) -> list[dict]:
    """Rows of metrics.jsonl; for a step logged twice (a resumed run), the last row wins."""
    path = Path(workdir) / METRICS_FILENAME
    if not path.is_file():
        return []
    rows = {}
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            rows[(row["kind"], row["step"])] = row
    return sorted(rows.values(), key=lambda row: (row["step"], row["kind"]))


def plot_curves(workdir: str | Path) -> Path | None:
    """PNG of train / eval loss and the learning rate against the step, from metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(workdir)
    train_rows = [row for row in rows if row["kind"] == "train"]
    eval_rows = [row for row in rows if row["kind"] == "eval"]
    if not train_rows:
        return None
    figure, (loss_axis, lr_axis) = plt.subplots(1, 2, figsize=(11, 4))
    steps = [row["step"] for row in train_rows]
    loss_axis.plot(steps, [row["loss"] for row in train_rows], label="train (label-smoothed)")
    loss_axis.plot(steps, [row["nll"] for row in train_rows], label="train NLL", alpha=0.7)
    if eval_rows:
        loss_axis.plot([row["step"] for row in eval_rows], [row["nll"] for row in eval_rows], "o-",
                       label="validation NLL")
    loss_axis.set_xlabel("step")
    loss_axis.set_ylabel("loss per target token (nats)")
    loss_axis.set_yscale("log")
    loss_axis.legend()
    loss_axis.grid(alpha=0.3)
    lr_axis.plot(steps, [row["learning_rate"] for row in train_rows])
    lr_axis.set_xlabel("step")
    lr_axis.set_ylabel("learning rate")
    lr_axis.grid(alpha=0.3)
    figure.tight_layout()
    path = Path(workdir) / PLOT_FILENAME
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


class _Logger:
    """metrics.jsonl (append) + TensorBoard events + a tqdm progress bar."""

    def __init__(self, workdir: Path, start: int, total: int, progress: bool):
        from tensorboardX import SummaryWriter

        self.file = open(workdir / METRICS_FILENAME, "a")
        self.writer = SummaryWriter(str(workdir / TENSORBOARD_DIR))
        self.bar = None
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True)

    def log(self, kind: str, step: int, values: dict) -> None:
        self.file.write(json.dumps({"kind": kind, "step": step, **values}) + "\n")
        self.file.flush()
        for key, value in values.items():
            self.writer.add_scalar(f"{kind}/{key}", value, step)
        self.writer.flush()

    def progress(self, steps: int, postfix: dict | None = None) -> None:
        if self.bar is not None:
            self.bar.update(steps)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)

    def message(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.writer.close()
        self.file.close()


# ---------------------------------------------------------------------------------------------- runner


def train(config: ml_collections.ConfigDict, workdir: str | Path,
          on_update: Callable[[int, dict], None] | None = None) -> dict:
    """Trains (or resumes) the experiment `config` in `workdir`. Returns a summary of the run.

    on_update(update, metrics): optional hook after every optimizer update, with that update's metrics on the
    host (fetching them each update costs a device sync; leave it None for speed).
    """
    from transformer_jax.data.batching import TrainBatches, eval_batches
    from transformer_jax.data.tokenizer import load_or_train_tokenizer

    started = time.perf_counter()
    config = complete_config(config)
    validate_config(config)
    data_cfg, train_cfg = config.data, config.train
    workdir = Path(workdir)
    source = make_source_from_config(data_cfg)
    mesh = parallel.make_mesh(dict(config.mesh))
    rules = tuple(parallel.DEFAULT_RULES)
    batch_axes = mesh.shape["data"] * mesh.shape["fsdp"]
    if data_cfg.eval_batch_size % batch_axes:
        raise ConfigError(f"data.eval_batch_size={data_cfg.eval_batch_size} must be a multiple of the "
                          f"data x fsdp mesh size {batch_axes}.")

    workdir.mkdir(parents=True, exist_ok=True)
    timings = {"setup": time.perf_counter() - started}
    tokenizer = load_or_train_tokenizer(
        workdir, source.pairs("train"), data_cfg.vocab_size, model_type=data_cfg.tokenizer_model_type,
        max_sentences=data_cfg.tokenizer_max_sentences, seed=train_cfg.seed,
    )
    model_cfg = model_config(config.model, vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id,
                             bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)
    timings["tokenizer"] = time.perf_counter() - started - sum(timings.values())
    optimizer_key = tuple((name, train_cfg[name]) for name in OPTIMIZER_FIELDS)
    jit_init, train_step, eval_step, abstract, schedule = _compiled_functions(
        model_cfg, optimizer_key, float(train_cfg.label_smoothing), int(train_cfg.accum_steps), mesh, rules,
        bool(train_cfg.fast_compile))

    checkpointer = ckpt.Checkpointer(workdir, keep=train_cfg.keep_checkpoints,
                                     async_save=train_cfg.async_checkpoints)
    try:
        latest = checkpointer.latest_step()
        if latest is not None:
            checkpointer.check_compatible(latest, abstract)  # before anything in the workdir is overwritten
        ckpt.save_config(workdir, resolved_config_dict(config, model_cfg))

        train_pairs = encode_pairs(tokenizer, list(source.pairs("train")))
        boundaries = tuple(data_cfg.bucket_boundaries) or None
        batches = TrainBatches(
            train_pairs, tokens_per_batch=data_cfg.tokens_per_batch, max_len=data_cfg.max_len,
            seed=train_cfg.seed, bucket_boundaries=boundaries, batch_multiple=batch_axes, pack=data_cfg.pack,
            pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id,
        )
        valid_pairs = encode_pairs(tokenizer, list(source.pairs("validation")))
        valid = [batch for _, batch in eval_batches(
            valid_pairs, batch_size=data_cfg.eval_batch_size, max_len=data_cfg.max_len, bucket_boundaries=boundaries,
            pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)]
        if data_cfg.max_eval_batches:
            valid = valid[:data_cfg.max_eval_batches]

        timings["data"] = time.perf_counter() - started - sum(timings.values())
        if latest is not None:
            state, data_state = checkpointer.restore(latest, abstract)
            batches.restore(data_state["batches"])
            logger.info("Resumed from %s at update %d.", checkpointer.directory / str(latest), latest)
        else:
            state = jit_init(jax.random.PRNGKey(train_cfg.seed))
        summary = _run_loop(config, workdir, state, batches, valid, train_step, eval_step, schedule, checkpointer,
                            mesh, rules, started, model_cfg, dropped=batches.dropped, on_update=on_update,
                            timings=timings)
    finally:
        checkpointer.close()
    plot = plot_curves(workdir)
    summary["plot"] = str(plot) if plot else None
    return summary


def _run_loop(config, workdir: Path, state: TrainState, batches, valid, train_step, eval_step, schedule,
              checkpointer, mesh, rules, started: float, model_cfg: ModelConfig, dropped: int,
              on_update=None, timings: dict | None = None) -> dict:
    train_cfg = config.train
    accum = train_cfg.accum_steps
    micro_step = int(jax.device_get(state.step))
    update = micro_step // accum
    start_update = update
    log = _Logger(workdir, start_update, train_cfg.steps, bool(train_cfg.progress))
    log.message(f"model: {count_params(state.params):,} parameters, vocab {model_cfg.vocab_size}; "
                f"{'resuming at' if update else 'starting at'} update {update} of {train_cfg.steps}"
                + (f"; {dropped} training pairs longer than max_len dropped" if dropped else ""))
    pending: list[dict] = []  # device metrics since the last log
    window_tokens, window_start = 0, time.perf_counter()
    first_step_time = None
    summary: dict[str, Any] = {"start_step": start_update, "interrupted": None}
    last_saved = update if update else None
    eval_metrics = None
    try:
        with _StopRequest() as stop:
            while update < train_cfg.steps:
                if stop.signal_name:
                    break
                batch = next(batches)
                window_tokens += int(np.count_nonzero(batch["inputs"]) + np.count_nonzero(batch["targets"]))
                state, metrics = train_step(state, parallel.shard_batch(batch, mesh, rules))
                pending.append(metrics)
                micro_step += 1
                if first_step_time is None:
                    jax.block_until_ready(metrics)
                    first_step_time = time.perf_counter() - started
                    parts = dict(timings or {})
                    parts["init/restore, compile, step"] = first_step_time - sum(parts.values())
                    log.message(f"time to first step: {first_step_time:.1f} s ("
                                + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in parts.items()) + ")")
                    window_start, window_tokens = time.perf_counter(), 0
                if micro_step % accum:
                    continue
                update += 1
                update_metrics = pending[-accum:]
                if update % train_cfg.log_every == 0 or update == train_cfg.steps:
                    values = _reduce(jax.device_get(pending))
                    elapsed = max(time.perf_counter() - window_start, 1e-9)
                    values["tokens_per_sec"] = window_tokens / elapsed
                    log.log("train", update, values)
                    log.progress(0, {"loss": f"{values['loss']:.3f}", "lr": f"{values['learning_rate']:.2e}",
                                     "tok/s": f"{values['tokens_per_sec']:.0f}"})
                    summary["train"] = values
                    pending, window_tokens, window_start = [], 0, time.perf_counter()
                log.progress(1)
                if update % train_cfg.eval_every == 0 or update == train_cfg.steps:
                    eval_metrics = evaluate(eval_step, state.params, valid, mesh, rules)
                    log.log("eval", update, eval_metrics)
                    log.message(f"update {update}: validation loss {eval_metrics['loss']:.4f}, "
                                f"NLL {eval_metrics['nll']:.4f}, perplexity {eval_metrics['perplexity']:.2f}, "
                                f"accuracy {eval_metrics['accuracy']:.3f}")
                    window_start = time.perf_counter()
                if update % train_cfg.checkpoint_every == 0 or update == train_cfg.steps:
                    checkpointer.save(update, state, {"batches": batches.state(), "micro_step": micro_step})
                    last_saved = update
                if on_update is not None:
                    on_update(update, _reduce(jax.device_get(update_metrics)))
            if stop.signal_name:
                summary["interrupted"] = stop.signal_name
                if micro_step % accum == 0 and last_saved != update:
                    checkpointer.save(update, state, {"batches": batches.state(), "micro_step": micro_step},
                                      wait=True)
                    log.message(f"{stop.signal_name}: saved a checkpoint at update {update}; "
                                f"run the same command to resume.")
                elif micro_step % accum:
                    log.message(f"{stop.signal_name}: stopped inside a gradient accumulation; the checkpoint at "
                                f"update {last_saved} is the resume point.")
    finally:
        checkpointer.wait()
        log.close()
    summary.update(step=update, time_to_first_step=first_step_time, eval=eval_metrics, timings=timings)
    return summary


def _reduce(metrics: list[dict]) -> dict:
    """Per-token means over the micro-batches since the last log, plus the last learning rate."""
    totals = {key: sum(float(m[key]) for m in metrics) for key in ("loss", "nll", "correct", "tokens")}
    values = loss_lib.summarize(totals)
    values["learning_rate"] = float(metrics[-1]["learning_rate"])
    applied = [float(m["grad_norm"]) for m in metrics if float(m["updated"])]
    values["grad_norm"] = float(np.mean(applied)) if applied else math.nan
    return values
