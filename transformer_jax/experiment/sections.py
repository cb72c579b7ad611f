"""The experiment's sections besides the model (config.py) and decoding (decoding/config.py): the data, the
optimizer, the run, the device mesh and the processes. Each is frozen and checks itself when made."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from transformer_jax.errors import ConfigError
from transformer_jax.section import Section, positive_int
from transformer_jax.selection import BestMetric

# How dropout masks are drawn (train/step.py: dropout_key).
DropoutPrng = Literal["rbg_threefry", "rbg", "threefry"]
DROPOUT_PRNGS = typing.get_args(DropoutPrng)

# SentencePiece's built-in normalization rules (data/tokenizer.py); the "_cf" ones fold case.
TokenizerNormalization = Literal["nmt_nfkc", "nmt_nfkc_cf", "nfkc", "nfkc_cf", "identity"]
TOKENIZER_NORMALIZATIONS = typing.get_args(TokenizerNormalization)

# Data sources with files in a directory (`data.path`).
SOURCES_WITH_DIRECTORY = ("local", "multi30k")


@dataclasses.dataclass(frozen=True)
class DataConfig(Section):
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
    # A directory written by `transformer-jax prepare` (data/prepared.py): the training pairs are read from it,
    # tokenized, by index; validation stays the source's text. "": the source's training split, encoded at start-up.
    prepared: str = ""
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
        if not all(positive_int(length) for length in self.bucket_boundaries):
            raise ConfigError(f"data.bucket_boundaries={self.bucket_boundaries!r} must be positive lengths.")
        if self.prepared and self.tokenizer_sampling:
            raise ConfigError(
                f"data.tokenizer_sampling={self.tokenizer_sampling} segments the text anew each epoch, but "
                f"data.prepared={self.prepared!r} holds it segmented once: drop one of them."
            )
        if not 0.0 <= self.tokenizer_sampling < 1.0:
            raise ConfigError(
                f"data.tokenizer_sampling={self.tokenizer_sampling} must lie in [0, 1) (0 = no sampling; BPE-dropout "
                "is usually 0.05-0.1)."
            )


@dataclasses.dataclass(frozen=True)
class OptimizerConfig(Section):
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
class TrainConfig(Section):
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
    best_metric: BestMetric = "perplexity"
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
class MeshConfig(Section):
    """The ('data', 'fsdp', 'tensor') device mesh (-1 = every remaining device), its rule table, the step's mode."""

    section: ClassVar[str] = "mesh"

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    # 'auto' shards over every mesh axis of size > 1; the others name a table of sharding.RULE_TABLES.
    rules: Literal["auto", "dp", "fsdp", "tensor", "fsdp_tensor"] = "auto"
    mode: Literal["jit", "pmap"] = "jit"  # jax.jit over the mesh | the step per device (train/step.py)

    @property
    def shape(self) -> dict[str, int]:
        """Axis sizes for sharding.make_mesh."""
        return {"data": self.data, "fsdp": self.fsdp, "tensor": self.tensor}

    def _validate(self) -> None:
        for axis in ("data", "fsdp", "tensor"):
            size = getattr(self, axis)
            if not (positive_int(size) or size == -1):
                raise ConfigError(f"mesh.{axis}={size!r} must be a positive device count or -1 (the rest).")
        if self.mode == "pmap" and (self.fsdp != 1 or self.tensor != 1):
            raise ConfigError(
                f"mesh.mode='pmap' is data parallel only, but the mesh asks for fsdp={self.fsdp}, "
                f"tensor={self.tensor}; use mesh.mode='jit' for FSDP / tensor parallelism."
            )


@dataclasses.dataclass(frozen=True)
class DistributedConfig(Section):
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
