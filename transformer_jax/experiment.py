"""The experiment configuration: one typed tree of frozen dataclasses, built once at the edge.

    Experiment(model, data, optimizer, train, decode, mesh, distributed)

experiments/*.py define `get_config() -> Experiment`; a workdir's config.json replays its run
(`Experiment.from_dict`); `--config.section.field=value` overrides are parsed by each field's declared type
(`apply_overrides`). Every section validates itself when it is made and names the field and the fix, so a bad
value fails before any work. This module is a leaf: it imports no runtime code.

    experiment = load_experiment("experiments/tiny.py", [("train.steps", "100")])
    experiment.train.steps, experiment.to_dict()

A new option is one field in its section plus the code that reads it: decode options become flags of
`translate` / `evaluate` from DecodeConfig's field metadata, every field is a `--config.` override.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

from transformer_jax.config import ModelConfig
from transformer_jax.errors import UserError


class ConfigError(UserError, ValueError):
    """The experiment config is wrong; the message says which field and how to fix it."""


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


class _Section:
    """Base of the sections: Literal fields hold one of their choices; `_positive` names positive-int fields."""

    section: ClassVar[str]
    _positive: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            value, hint = getattr(self, field.name), hints[field.name]
            if typing.get_origin(hint) is Literal and value not in typing.get_args(hint):
                raise ConfigError(
                    f"{self.section}.{field.name}={value!r} is unknown; use one of {typing.get_args(hint)}."
                )
        for name in self._positive:
            if not _positive_int(getattr(self, name)):
                raise ConfigError(f"{self.section}.{name}={getattr(self, name)!r} must be a positive integer.")
        self._validate()

    def _validate(self) -> None:
        """Checks beyond choices and positive integers."""

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


# How dropout masks are drawn (train/step.py: dropout_key).
DropoutPrng = Literal["rbg_threefry", "rbg", "threefry"]
DROPOUT_PRNGS = typing.get_args(DropoutPrng)

# SentencePiece's built-in normalization rules (data/tokenizer.py); the "_cf" ones fold case.
TokenizerNormalization = Literal["nmt_nfkc", "nmt_nfkc_cf", "nfkc", "nfkc_cf", "identity"]
TOKENIZER_NORMALIZATIONS = typing.get_args(TokenizerNormalization)

# Data sources with files in a directory (`data.path`).
SOURCES_WITH_DIRECTORY = ("local", "multi30k")


@dataclasses.dataclass(frozen=True)
class DataConfig(_Section):
    """Parallel text, the shared SentencePiece vocabulary (§5.1) and how batches are cut."""

    section: ClassVar[str] = "data"
    _positive: ClassVar[tuple[str, ...]] = (
        "vocab_size",
        "tokens_per_batch",
        "max_len",
        "eval_batch_size",
        "tokenizer_max_sentences",
    )

    source: Literal["builtin", "local", "multi30k", "tfds"] = "builtin"  # transformer_jax.data.sources
    path: str = ""  # directory of local / multi30k files, or the tfds data_dir
    source_lang: str = "en"
    target_lang: str = "de"
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # further keyword options of the source
    vocab_size: int = 37000  # shared source/target BPE vocabulary (§5.1); the model's vocab_size follows it
    tokenizer_model_type: Literal["bpe", "unigram"] = "bpe"
    # SentencePiece's normalization rule; "nmt_nfkc_cf" folds case (a lowercased model, as in lowercased benchmarks)
    tokenizer_normalization: TokenizerNormalization = "nmt_nfkc"
    tokenizer_max_sentences: int = 1_000_000
    # > 0: every epoch segments the training pairs anew by sampling (data/tokenizer.Tokenizer.sample_pairs): for a
    # BPE model the BPE-dropout probability (Provilkov et al. 2020), for unigram subword regularization's alpha
    # (Kudo 2018). Validation, test and translation keep the one best segmentation. 0: that one always (the paper).
    tokenizer_sampling: float = 0.0
    # Padded positions per side of a batch (rows x bucket length, pad included): the static shapes jit sees.
    # Real tokens are fewer (~72% with the default buckets on WMT-like lengths; experiments/base.py sets 35000
    # for §5.1's ~25000 source + ~25000 target tokens).
    tokens_per_batch: int = 35000
    max_len: int = 256
    pack: bool = False
    bucket_boundaries: tuple[int, ...] = ()  # () = data.batching.default_bucket_boundaries(max_len)
    eval_batch_size: int = 64
    max_eval_batches: int = 0  # 0 = the whole validation split

    def _validate(self) -> None:
        if not all(_positive_int(length) for length in self.bucket_boundaries):
            raise ConfigError(f"data.bucket_boundaries={self.bucket_boundaries!r} must be positive lengths.")
        if not 0.0 <= self.tokenizer_sampling < 1.0:
            raise ConfigError(
                f"data.tokenizer_sampling={self.tokenizer_sampling} must lie in [0, 1) (0 = no sampling; BPE-dropout "
                "is usually 0.05-0.1)."
            )


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(_Section):
    """Adam and the warm-up / inverse-square-root learning rate (§5.3); read by train/optimizer.make_optimizer.

    lrate = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5); no clipping in the paper.
    An optional cool-down (not in the paper) scales it down linearly to zero over the cooldown_steps updates after
    update cooldown_start; optional decoupled weight decay (AdamW, not in the paper either).
    """

    section: ClassVar[str] = "optimizer"
    _positive: ClassVar[tuple[str, ...]] = ("warmup_steps",)

    warmup_steps: int = 4000
    lr_scale: float = 1.0
    adam_b1: float = 0.9
    adam_b2: float = 0.98
    adam_eps: float = 1e-9
    clip_grad_norm: float = 0.0  # global-norm clipping; 0 = off
    cooldown_start: int = 0  # the last update at the full schedule
    cooldown_steps: int = 0  # updates of the linear cool-down after it; 0 = none (the paper's schedule)
    weight_decay: float = 0.0  # AdamW's decoupled decay of every parameter, times the learning rate; 0 = Adam

    def _validate(self) -> None:
        if self.lr_scale <= 0:
            raise ConfigError(f"optimizer.lr_scale={self.lr_scale} must be positive.")
        if self.weight_decay < 0:
            raise ConfigError(
                f"optimizer.weight_decay={self.weight_decay} must be non-negative (0: Adam, as in the paper; "
                "AdamW runs usually take 0.0001-0.1)."
            )
        if self.cooldown_start < 0 or self.cooldown_steps < 0:
            raise ConfigError(
                f"optimizer.cooldown_start={self.cooldown_start} and cooldown_steps={self.cooldown_steps} must be "
                "non-negative (cooldown_steps 0: no cool-down)."
            )
        for name in ("adam_b1", "adam_b2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"optimizer.{name}={getattr(self, name)} must lie in [0, 1).")


@dataclasses.dataclass(frozen=True)
class TrainConfig(_Section):
    """The run: its length or time budget, the loss, seeds, intervals, checkpoints, what to report."""

    section: ClassVar[str] = "train"
    _positive: ClassVar[tuple[str, ...]] = (
        "steps",
        "accum_steps",
        "log_every",
        "eval_every",
        "checkpoint_every",
        "keep_checkpoints",
        "bleu_max_sentences",
    )

    steps: int = 100_000  # optimizer updates
    max_minutes: float = 0.0  # time budget of a train command (0 = none): stop, checkpoint and evaluate when spent
    label_smoothing: float = 0.1  # §5.4
    seed: int = 0
    accum_steps: int = 1  # micro-batches per update (each of data.tokens_per_batch tokens)
    log_every: int = 100
    eval_every: int = 5000
    checkpoint_every: int = 5000
    keep_checkpoints: int = 5  # the latest
    # Also keep the best this many checkpoints by the validation metric best_metric (selection.py); 0 = off. Their
    # steps need a validation: eval_every (perplexity) or bleu_every (bleu) must divide checkpoint_every.
    keep_best: int = 0
    best_metric: Literal["perplexity", "bleu"] = "perplexity"
    async_checkpoints: bool = True
    progress: bool = True
    # Dropout mask bits (train/step.py: dropout_key), all drawn from (seed, step) so a resumed run is exact: XLA's
    # RngBitGenerator with Threefry (fastest on a CPU) or its default algorithm (Philox on CPU, the TPU hardware
    # generator), or JAX's threefry keys (the same masks on every device layout).
    dropout_prng: DropoutPrng = "rbg_threefry"
    fast_compile: bool = False  # XLA optimization level 0: 2-3x faster CPU compiles, slower steps (tests, smoke runs)
    bleu_every: int = 0  # greedy BLEU / chrF of the validation split every this many updates (0 = never)
    bleu_max_sentences: int = 500  # the first this many validation pairs for the periodic BLEU
    final_bleu: Literal["beam", "greedy", "none"] = "beam"  # the whole validation split at the end

    def _validate(self) -> None:
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"train.label_smoothing={self.label_smoothing} must lie in [0, 1).")
        if isinstance(self.max_minutes, bool) or not isinstance(self.max_minutes, (int, float)) or self.max_minutes < 0:
            raise ConfigError(
                f"train.max_minutes={self.max_minutes!r} must be a number of minutes >= 0 (0 = no budget)."
            )
        if not isinstance(self.bleu_every, int) or self.bleu_every < 0:
            raise ConfigError(f"train.bleu_every={self.bleu_every!r} must be a non-negative integer (0 = off).")
        if not isinstance(self.keep_best, int) or self.keep_best < 0:
            raise ConfigError(f"train.keep_best={self.keep_best!r} must be a non-negative integer (0 = off).")
        intervals = {"perplexity": ("eval_every", self.eval_every), "bleu": ("bleu_every", self.bleu_every)}
        name, every = intervals[self.best_metric]
        if self.keep_best and (not every or self.checkpoint_every % every):
            raise ConfigError(
                f"train.keep_best={self.keep_best} ranks checkpoints by validation {self.best_metric}, but "
                f"train.{name}={every} does not divide train.checkpoint_every={self.checkpoint_every}, so the "
                f"checkpoints would have no {self.best_metric} to rank; set train.{name} to a divisor of "
                f"{self.checkpoint_every} (e.g. --config.train.{name}={self.checkpoint_every})."
            )


@dataclasses.dataclass(frozen=True)
class DecodeConfig(_Section):
    """How to decode. §6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6 ... maximum
    output length to input length + 50, but terminate early when possible"."""

    section: ClassVar[str] = "decode"
    _positive: ClassVar[tuple[str, ...]] = ("beam_size",)

    # Each field's `help` is its command-line help (`--beam-size`, ... in translate / evaluate).
    beam_size: int = dataclasses.field(default=4, metadata={"help": "hypotheses kept (§6.1: 4)"})
    alpha: float = dataclasses.field(
        default=0.6, metadata={"help": "GNMT length penalty ((5 + |Y|) / 6) ** alpha, |Y| counting the EOS (§6.1: 0.6)"}
    )
    extra_length: int = dataclasses.field(
        default=50, metadata={"help": "per sentence: output length <= source length + this (§6.1: 50)"}
    )
    max_decode_len: int | None = dataclasses.field(
        default=None, metadata={"help": "static output buffer (default: padded source width + extra length)"}
    )
    cache_segment: int = dataclasses.field(
        default=8,
        metadata={
            "help": "decode in jitted segments of this many steps; between them finished sentences leave the batch "
            "and the cache, which starts with room for this many positions, doubles when the next segment needs "
            "more (0 = one loop over the whole buffer)"
        },
    )
    gather: Literal["take", "one_hot"] = dataclasses.field(
        default="take",
        metadata={
            "help": "reordering hypotheses: 'take' (batched gather) or 'one_hot' (matmuls, t5x's choice on TPUs)"
        },
    )

    def _validate(self) -> None:
        if not isinstance(self.extra_length, int) or self.extra_length < 0:
            raise ConfigError(f"decode.extra_length must be a non-negative integer, got {self.extra_length!r}.")
        if isinstance(self.cache_segment, bool) or not isinstance(self.cache_segment, int) or self.cache_segment < 0:
            raise ConfigError(f"decode.cache_segment must be a non-negative integer, got {self.cache_segment!r}.")
        if self.max_decode_len is not None and not _positive_int(self.max_decode_len):
            raise ConfigError(f"decode.max_decode_len must be None or a positive integer, got {self.max_decode_len!r}.")


@dataclasses.dataclass(frozen=True)
class MeshConfig(_Section):
    """The ('data', 'fsdp', 'tensor') device mesh (-1 = every remaining device), its rule table, the step's mode."""

    section: ClassVar[str] = "mesh"

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    # 'auto' shards over every mesh axis of size > 1; the others name a table of parallel.RULE_TABLES.
    rules: Literal["auto", "dp", "fsdp", "tensor", "fsdp_tensor"] = "auto"
    mode: Literal["jit", "pmap"] = "jit"  # jax.jit over the mesh | the step per device (train/step.py)

    @property
    def shape(self) -> dict[str, int]:
        """Axis sizes for parallel.make_mesh."""
        return {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}

    def _validate(self) -> None:
        for axis in ("data", "fsdp", "tensor"):
            size = getattr(self, axis)
            if not (_positive_int(size) or size == -1):
                raise ConfigError(f"mesh.{axis}={size!r} must be a positive device count or -1 (the rest).")
        if self.mode == "pmap" and (self.fsdp != 1 or self.tensor != 1):
            raise ConfigError(
                f"mesh.mode='pmap' is data parallel only, but the mesh asks for fsdp={self.fsdp}, "
                f"tensor={self.tensor}; use mesh.mode='jit' for FSDP / tensor parallelism."
            )


@dataclasses.dataclass(frozen=True)
class DistributedConfig(_Section):
    """How this process joins a multi-process run (transformer_jax.distributed). None fields come from the
    environment / auto-detection.

    enabled: True = always call jax.distributed.initialize (e.g. on a Cloud TPU pod slice, where JAX detects
    everything); False = never; None = only when a setting is given or a launcher (SLURM, Open MPI) says there are
    several processes.
    cpu_collectives: 'gloo' (JAX's default) or 'mpi', for cross-process collectives of CPU devices.
    """

    section: ClassVar[str] = "distributed"  # checked with the environment by distributed.resolve_config

    enabled: bool | None = None
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None
    initialization_timeout: int = 300
    heartbeat_timeout: int = 100
    cluster_detection_method: str | None = None
    cpu_collectives: str | None = None


# ModelConfig fields that the tokenizer decides (data.vocab_size; the special ids of data/tokenizer.py).
TOKENIZER_FIELDS = ("vocab_size", "pad_id", "bos_id", "eos_id")


@dataclasses.dataclass(frozen=True)
class Experiment:
    """The whole configuration of a run. `model.vocab_size` always equals `data.vocab_size`."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)

    def __post_init__(self):
        if self.model.vocab_size != self.data.vocab_size:
            try:
                object.__setattr__(self, "model", self.model.replace(vocab_size=self.data.vocab_size))
            except ValueError as error:
                raise ConfigError(f"data.vocab_size={self.data.vocab_size}: {error}") from None
        if self.data.max_len > self.model.max_len:
            raise ConfigError(
                f"data.max_len={self.data.max_len} exceeds the model's max_len={self.model.max_len} "
                f"(positions table); raise --config.model.max_len or lower data.max_len."
            )

    def replace(self, **changes) -> Experiment:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """JSON-able: tuples as lists, dtypes by name."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Experiment:
        """From `to_dict()` output (a workdir's config.json, `workdir.load_config`); sections left out keep their
        defaults."""
        unknown = sorted(set(values) - set(SECTIONS))
        if unknown:
            raise ConfigError(f"unknown config sections {unknown}; known: {sorted(SECTIONS)}.")
        sections = {}
        for name, fields in values.items():
            section_cls = SECTIONS[name]
            known = {field.name for field in dataclasses.fields(section_cls)}
            if set(fields) - known:
                raise ConfigError(
                    f"unknown fields {sorted(set(fields) - known)} in section {name!r}; known: {sorted(known)}."
                )
            sections[name] = _build(section_cls, name, {key: _as_tuples(value) for key, value in fields.items()})
        return cls(**sections)


SECTIONS: dict[str, type] = typing.get_type_hints(Experiment)  # section name -> its dataclass


def _build(section_cls: type, name: str, fields: Mapping[str, Any]):
    """section_cls(**fields), its ValueErrors (ModelConfig's) as ConfigErrors naming the section."""
    try:
        return section_cls(**fields)
    except ConfigError:
        raise
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{name} section: {error}") from None


def _as_tuples(value: Any) -> Any:
    """JSON has lists where the config holds tuples (bucket_boundaries, ...)."""
    if isinstance(value, list):
        return tuple(_as_tuples(item) for item in value)
    if isinstance(value, dict):
        return {key: _as_tuples(item) for key, item in value.items()}
    return value


# --------------------------------------------------------------------------------------- files and overrides


def load_config_file(path: str | Path) -> Experiment:
    """The Experiment of a Python file's `get_config()`, or of a workdir's config.json (replays that run)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} not found; e.g. --config experiments/tiny.py")
    if path.suffix == ".json":
        from transformer_jax.workdir import upgrade_config  # a workdir's config.json, of any version

        try:
            return Experiment.from_dict(upgrade_config(json.loads(path.read_text())))
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path} is not valid JSON ({error}).") from None
    module = exec_python_file(path, "_experiment_")
    if module is None:
        raise ConfigError(f"{path} is not a Python file; give an experiments/*.py file or a workdir's config.json.")
    try:
        experiment = module.get_config() if hasattr(module, "get_config") else None
    except ValueError as error:  # a section's ConfigError, or ModelConfig's ValueError
        raise ConfigError(f"{path}: {error}") from None
    if not isinstance(experiment, Experiment):
        raise ConfigError(f"{path} must define get_config() returning a transformer_jax.experiment.Experiment.")
    return experiment


def exec_python_file(path: Path, prefix: str) -> types.ModuleType | None:
    """The executed module of a user's Python file (an experiment or sweep file), None if it is not Python source.
    A syntax error in it is a ConfigError naming the file, line and text."""
    spec = importlib.util.spec_from_file_location(f"{prefix}{path.stem}", path)
    if spec is None or spec.loader is None or path.suffix != ".py":
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        raise ConfigError(
            f"{path}, line {error.lineno}: {error.msg}: {(error.text or '').strip()!r}; fix the file and run again."
        ) from None
    return module


def load_experiment(path: str | Path, overrides: Iterable[tuple[str, str]] = ()) -> Experiment:
    """`load_config_file(path)` with ('section.field', 'text') overrides applied."""
    return apply_overrides(load_config_file(path), overrides)


def apply_overrides(experiment: Experiment, overrides: Iterable[tuple[str, str]]) -> Experiment:
    """A new Experiment with ('train.steps', '100') pairs applied, each parsed by the field's declared type.

    Unknown fields are errors that list the known ones; `data.options.NAME` takes any name (an option of the
    source). The values are checked once all are in, by the sections as they are rebuilt and by the Experiment,
    so the order of the overrides does not matter (`model.attention_impl=cudnn model.dtype=bfloat16`).
    """
    changes: dict[str, dict[str, Any]] = {}  # section name -> field -> new value
    for dotted, text in overrides:
        section_name, _, name = dotted.partition(".")
        if section_name not in SECTIONS or not name:
            raise ConfigError(f"--config.{dotted}: no section {section_name!r}; known: {sorted(SECTIONS)}.")
        section = getattr(experiment, section_name)
        fields = changes.setdefault(section_name, {})
        if dotted.startswith("data.options."):
            option = dotted.removeprefix("data.options.")
            fields["options"] = {**fields.get("options", section.options), option: _parse(text, Any, dotted)}
            continue
        known = sorted(field.name for field in dataclasses.fields(section))
        if name not in known:
            raise ConfigError(f"--config.{dotted}: unknown field {name!r}; known fields of {section_name}: {known}.")
        if section_name == "model" and name in TOKENIZER_FIELDS:
            raise ConfigError(
                f"--config.{dotted}: vocab_size and the special ids come from the SentencePiece "
                f"model; set data.vocab_size."
            )
        fields[name] = _parse(text, typing.get_type_hints(type(section))[name], dotted)
    rebuilt = {
        name: _build(type(getattr(experiment, name)), name, {**_fields(getattr(experiment, name)), **fields})
        for name, fields in changes.items()
    }
    return experiment.replace(**rebuilt)  # cross-section checks raise ConfigError


def _fields(section) -> dict[str, Any]:
    return {field.name: getattr(section, field.name) for field in dataclasses.fields(section)}


def _parse(text: str, hint: Any, dotted: str) -> Any:
    """The value of `--config.{dotted}={text}` for a field annotated `hint`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in args if arg is not type(None)]
        if text.strip().lower() in ("none", "null") and len(options) < len(args):
            return None
        return _parse(text, options[0], dotted)
    if origin is Literal or hint is str:
        return text
    if hint is bool:
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"--config.{dotted}={text!r}: expected true or false.")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if hint is Any:  # e.g. model.dtype=bfloat16
            return text
        raise ConfigError(f"--config.{dotted}={text!r}: expected {_type_name(hint)}.") from None
    if hint is Any:
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if origin is tuple:
        return tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not isinstance(value, origin or hint) or (isinstance(value, bool) and hint is not bool):
        raise ConfigError(f"--config.{dotted}={text!r}: expected {_type_name(hint)}, got {type(value).__name__}.")
    return value


def _type_name(hint: Any) -> str:
    name = getattr(typing.get_origin(hint) or hint, "__name__", str(hint))
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"
