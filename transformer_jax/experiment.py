"""Experiment configs: the schema with the paper's defaults, loading a file, command-line overrides, validation.

An experiment config (experiments/*.py, `get_config()` -> ml_collections.ConfigDict) has these sections:

  model        preset name ('tiny' | 'base' | 'big') plus any ModelConfig fields as overrides; vocab_size and the
               special ids come from the trained SentencePiece model, never from here.
  data         source kind + options, SentencePiece vocab size, tokens per batch, max length, packing, eval sizes.
  train        steps (optimizer updates), schedule, Adam constants, label smoothing, seed, accumulation, clipping,
               intervals (log / eval / BLEU / checkpoint), checkpoints kept.
  decode       beam size, length penalty, extra output length (§6.1) for validation BLEU.
  mesh         sizes of the ('data', 'fsdp', 'tensor') mesh axes (-1 = all remaining devices), rule table, jit / pmap.
  distributed  multi-process start-up (transformer_jax.distributed); all None = one process or auto-detected.

    config = complete_config(load_config_file("experiments/tiny.py"))
    apply_overrides(config, [("train.steps", "100")])
    validate_config(config)
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import ml_collections

from transformer_jax import parallel
from transformer_jax.config import PRESETS, ModelConfig
from transformer_jax.decoding import DecodeConfig
from transformer_jax.distributed import DistributedConfig

# Fields of ModelConfig that the tokenizer decides.
TOKENIZER_FIELDS = ("vocab_size", "pad_id", "bos_id", "eos_id")
MODEL_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name not in TOKENIZER_FIELDS)
SOURCES_WITH_DIRECTORY = ("local", "multi30k")
FINAL_BLEU_METHODS = ("beam", "greedy", "none")


class ConfigError(ValueError):
    """The experiment config is wrong; the message says which field and how to fix it."""


# How dropout masks are drawn (train/step.py: dropout_key): 'rbg' (XLA's RngBitGenerator, fast) or 'threefry'
# (JAX's default; the same masks on every device layout).
DROPOUT_PRNGS = ("rbg_threefry", "rbg", "threefry")

# The `train` fields train/optimizer.make_optimizer reads (§5.3: Adam 0.9 / 0.98 / 1e-9, 4000 warm-up updates;
# no clipping in the paper). A new optimizer option is one entry here plus its use in make_optimizer.
OPTIMIZER_DEFAULTS = dict(warmup_steps=4000, lr_scale=1.0, adam_b1=0.9, adam_b2=0.98, adam_eps=1e-9,
                          clip_grad_norm=0.0)


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
        # Padded positions per side of a batch (rows x bucket length, pad included): the static shapes jit sees.
        # Real tokens are fewer (~72% with the default buckets on WMT-like lengths; experiments/base.py sets 35000
        # for §5.1's ~25000 source + ~25000 target tokens).
        tokens_per_batch=35000,
        max_len=256,
        pack=False,
        bucket_boundaries=(),  # () = data.batching.default_bucket_boundaries(max_len)
        eval_batch_size=64,
        max_eval_batches=0,  # 0 = the whole validation split
    ))
    config.train = ml_collections.ConfigDict(dict(
        steps=100_000,  # optimizer updates
        max_minutes=0.0,  # time budget of a train command (0 = none): stop, checkpoint and evaluate when spent
        **OPTIMIZER_DEFAULTS,
        label_smoothing=0.1,
        seed=0,
        accum_steps=1,  # micro-batches per update (each of data.tokens_per_batch tokens)
        log_every=100,
        eval_every=5000,
        checkpoint_every=5000,
        keep_checkpoints=5,
        async_checkpoints=True,
        progress=True,
        dropout_prng="rbg_threefry",  # RngBitGenerator: "rbg_threefry" (fastest on CPU) | "rbg" (Philox; TPU hardware) | "threefry" (same masks on every layout)
        fast_compile=False,  # XLA optimization level 0: 2-3x faster CPU compiles, slower steps (tests, smoke runs)
        bleu_every=0,  # greedy BLEU / chrF of the validation split every this many updates (0 = never)
        bleu_max_sentences=500,  # the first this many validation pairs for the periodic BLEU
        final_bleu="beam",  # the whole validation split at the end: 'beam' (decode section) | 'greedy' | 'none'
    ))
    config.decode = ml_collections.ConfigDict(dataclasses.asdict(DecodeConfig()))  # §6.1: beam 4, alpha 0.6, +50
    config.mesh = ml_collections.ConfigDict(dict(
        data=-1, fsdp=1, tensor=1,
        rules="auto",  # 'auto' (shard over every mesh axis of size > 1) | one of parallel.RULE_TABLES
        mode="jit",  # 'jit' (jax.jit over the mesh) | 'pmap' (replicated data parallelism)
    ))
    # Every field transformer_jax.distributed.initialize reads; None = from the environment / auto-detection.
    config.distributed = ml_collections.ConfigDict(dataclasses.asdict(DistributedConfig()))
    return config


def decode_config(config: ml_collections.ConfigDict) -> DecodeConfig:
    """The DecodeConfig of the `decode` section."""
    try:
        return DecodeConfig(**config.decode.to_dict())
    except (TypeError, ValueError) as error:
        raise ConfigError(f"decode section: {error}") from error


def load_config_file(path: str | Path) -> ml_collections.ConfigDict:
    """Runs `get_config()` of a Python config file and returns it locked (unknown fields are errors)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} not found; e.g. --config experiments/tiny.py")
    if path.suffix == ".json":  # a workdir's config.json: replay that run's settings
        config = ml_collections.ConfigDict(_lists_as_tuples(json.loads(path.read_text())))
        config.lock()
        return config
    spec = importlib.util.spec_from_file_location(f"_experiment_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{path} has no get_config() function.")
    config = module.get_config()
    config.lock()
    return config


def _lists_as_tuples(value: Any) -> Any:
    """JSON has lists where configs hold tuples (bucket_boundaries, ...)."""
    if isinstance(value, dict):
        return {key: _lists_as_tuples(item) for key, item in value.items()}
    return tuple(value) if isinstance(value, list) else value


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
        raise ConfigError(f"unknown config fields {unknown}; see transformer_jax.experiment.default_config().")
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
    if isinstance(train.max_minutes, bool) or not isinstance(train.max_minutes, (int, float)) or \
            train.max_minutes < 0:
        raise ConfigError(f"train.max_minutes={train.max_minutes!r} must be a number of minutes >= 0 (0 = no budget).")
    if train.lr_scale <= 0:
        raise ConfigError(f"train.lr_scale={train.lr_scale} must be positive.")
    if not isinstance(train.bleu_every, int) or train.bleu_every < 0:
        raise ConfigError(f"train.bleu_every={train.bleu_every!r} must be a non-negative integer (0 = off).")
    if not isinstance(train.bleu_max_sentences, int) or train.bleu_max_sentences <= 0:
        raise ConfigError(f"train.bleu_max_sentences={train.bleu_max_sentences!r} must be a positive integer.")
    if train.final_bleu not in FINAL_BLEU_METHODS:
        raise ConfigError(f"train.final_bleu={train.final_bleu!r} is unknown; use one of {FINAL_BLEU_METHODS}.")
    if train.dropout_prng not in DROPOUT_PRNGS:
        raise ConfigError(f"train.dropout_prng={train.dropout_prng!r} is unknown; use one of {DROPOUT_PRNGS}.")
    decode_config(config)
    if config.mesh.rules != "auto" and config.mesh.rules not in parallel.RULE_TABLES:
        raise ConfigError(f"mesh.rules={config.mesh.rules!r} is unknown; use 'auto' or one of "
                          f"{sorted(parallel.RULE_TABLES)}.")
    try:
        parallel.parallel_mode(config.mesh)
    except ValueError as error:
        raise ConfigError(str(error)) from None
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


# Fields a resumed run may not change: they define the model or the data stream the checkpoint continues.
RESUME_FIXED = ("model.", "data.source", "data.options.", "data.source_lang", "data.target_lang", "data.vocab_size",
                "data.tokenizer_", "data.tokens_per_batch", "data.max_len", "data.pack", "data.bucket_boundaries",
                "train.seed", "train.accum_steps")


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def resume_changes(saved: dict, new: dict) -> tuple[list[str], list[str]]:
    """(refused, allowed): 'field: old → new' lines between a workdir's config.json and the new resolved config.

    Refused changes alter the model or the data stream the checkpoint continues (RESUME_FIXED); the others
    (schedule, intervals, steps, budget, decoding, mesh, ...) are allowed and reported.
    """
    old, updated = _flatten(saved), _flatten(new)
    refused, allowed = [], []
    for field in sorted(set(old) | set(updated)):
        before, after = old.get(field, "(unset)"), updated.get(field, "(unset)")
        if before != after:
            line = f"{field}: {before!r} → {after!r}"
            (refused if field.startswith(RESUME_FIXED) else allowed).append(line)
    return refused, allowed


def make_source_from_config(data: ml_collections.ConfigDict, splits: tuple[str, ...] = ("train", "validation")):
    """The parallel-text source of the `data` section; a missing file of `splits` (directory sources) fails here."""
    from transformer_jax.data.sources import make_source

    options = dict(data.options.to_dict()) if data.options else {}
    if data.source in SOURCES_WITH_DIRECTORY:
        options.setdefault("directory", data.path)
    if data.source == "tfds" and data.path:
        options.setdefault("data_dir", data.path)
    if data.source != "builtin":
        options.setdefault("source_lang", data.source_lang)
        options.setdefault("target_lang", data.target_lang)
    try:
        source = make_source(data.source, **options)
    except TypeError as error:  # an unknown or misspelt name in data.options
        raise ConfigError(f"data.options: {error}") from None
    if data.source in SOURCES_WITH_DIRECTORY:  # fail now, naming the missing file, not after tokenizer training
        for split in splits:
            for lang in (source.source_lang, source.target_lang):
                source.path(split, lang)
    return source


def check_splits_not_empty(source) -> None:
    """Training needs a pair in 'train' (the tokenizer learns from it) and in 'validation'; checked before any work."""
    for split, field in (("train", "data.path / data.source"), ("validation", "data.path / data.source")):
        if next(iter(source.pairs(split)), None) is None:
            raise ConfigError(f"the {split} split of data.source={source.__class__.__name__} has no sentence pairs "
                              f"(empty files, or every pair skipped as empty or too long); check {field}.")
