"""ModelConfig: the one frozen description of a Transformer, passed to every module.

Defaults follow Vaswani et al. 2017 ("Attention Is All You Need"); presets `base()` and `big()` are the
rows of Table 3, `tiny()` is a small model for tests and the demo. Options that the popular ports use
instead of the paper (pre-LN, learned positions, [sin|cos] halves, attention dropout) exist but are off.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

NORM_POSITIONS = ("post", "pre")
# The kernel of training-time attention: the einsum path (attention weights in float32, sown for attention maps)
# or jax.nn.dot_product_attention's XLA or cuDNN (fused, flash) implementation. Decoding always reads the cache
# with the einsum path.
ATTENTION_IMPLS = ("einsum", "xla", "cudnn")
POSITION_KINDS = ("sinusoidal", "learned")
SINUSOID_LAYOUTS = ("interleaved", "halves")
ACTIVATIONS = ("relu", "swish", "gelu")  # gelu: the exact erf form


def _as_dtype(value: Any, field: str) -> jnp.dtype:
    try:
        return jnp.dtype(value)
    except TypeError as error:
        raise ValueError(f"ModelConfig.{field}={value!r} is not a dtype; use e.g. 'float32' or 'bfloat16'.") from error


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of the encoder-decoder (paper §3, Table 3)."""

    vocab_size: int = 37000  # shared source/target BPE vocabulary (§5.1)
    d_model: int = 512
    num_heads: int = 8
    # §3.2.2: each head projects queries and keys to d_k and values to d_v; None = d_model / num_heads, as in all
    # the paper's models but Table 3 row (B), which shrinks d_k alone. Resolved sizes: the d_k and d_v properties.
    key_dim: int | None = None  # d_k
    value_dim: int | None = None  # d_v
    d_ff: int = 2048
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    # §5.4: dropout on each sub-layer output and on the embedding + position sums.
    dropout_rate: float = 0.1
    # Not in the paper (0 there); tensor2tensor and many ports use them.
    attention_dropout_rate: float = 0.0
    relu_dropout_rate: float = 0.0
    # §3.3's FFN nonlinearity is ReLU; Marian (OPUS-MT) models use swish or gelu.
    activation: str = "relu"
    # §3.1 post-LN: LayerNorm(x + Dropout(Sublayer(x))). 'pre' adds a final LayerNorm per stack.
    norm_position: str = "post"
    # §3.5 sinusoids; 'learned' is the paper's Table 3 row (E) variant.
    position_encoding: str = "sinusoidal"
    # §3.5 interleaves PE(pos,2i)=sin, PE(pos,2i+1)=cos; 'halves' is tensor2tensor's [sin | cos].
    sinusoid_layout: str = "interleaved"
    max_len: int = 512
    # §3.4: one matrix for source embedding, target embedding and pre-softmax projection.
    share_embeddings: bool = True
    # A learned per-token bias added to the output logits (Marian's final_logits_bias); the paper has none.
    final_logits_bias: bool = False
    # §3.2.2 writes the projections without biases (as tensor2tensor does); torch uses them.
    attention_bias: bool = False
    # ATTENTION_IMPLS; 'xla' and 'cudnn' need d_k == d_v; 'cudnn' needs a GPU, bfloat16/float16, d_k % 8 == 0
    attention_impl: str = "einsum"
    layer_norm_epsilon: float = 1e-6
    dtype: Any = jnp.float32  # activations
    param_dtype: Any = jnp.float32
    pad_id: int = 0
    bos_id: int = 1  # the decoder's start token; it may equal pad_id (Marian starts the decoder from pad)
    eos_id: int = 2

    def __post_init__(self):
        object.__setattr__(self, "dtype", _as_dtype(self.dtype, "dtype"))
        object.__setattr__(self, "param_dtype", _as_dtype(self.param_dtype, "param_dtype"))
        self._validate()

    @property
    def head_dim(self) -> int:
        """d_model / num_heads: the default of d_k and d_v (§3.2.2)."""
        return self.d_model // self.num_heads

    @property
    def d_k(self) -> int:
        """Per-head size of queries and keys (§3.2.1): key_dim, or d_model / num_heads."""
        return self.head_dim if self.key_dim is None else self.key_dim

    @property
    def d_v(self) -> int:
        """Per-head size of values (§3.2.2): value_dim, or d_model / num_heads."""
        return self.head_dim if self.value_dim is None else self.value_dim

    @property
    def has_paper_head_sizes(self) -> bool:
        """d_k = d_v = d_model / num_heads (§3.2.2), the only sizes torch's and CTranslate2's attention hold."""
        return self.d_model % self.num_heads == 0 and self.d_k == self.d_v == self.head_dim

    @property
    def marian_options(self) -> list[str]:
        """'field=value' for each option set that only imported Marian models use (interop/marian.py); the
        torch reference and the CTranslate2 export hold none of them."""
        options = []
        if self.activation != "relu":
            options.append(f"activation={self.activation!r}")
        if self.final_logits_bias:
            options.append("final_logits_bias=True")
        if self.bos_id == self.pad_id:
            options.append(f"bos_id=pad_id={self.pad_id}")
        return options

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def _validate_attention_impl(self) -> None:
        """The rules of a fused kernel that a config alone decides (the GPU itself is checked when attention runs)."""
        impl = self.attention_impl
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"ModelConfig.attention_impl={impl!r} is unknown; use one of {ATTENTION_IMPLS}.")
        if impl != "einsum" and self.attention_dropout_rate:
            raise ValueError(
                f"ModelConfig.attention_impl={impl!r} has no dropout on the attention weights, but "
                f"attention_dropout_rate={self.attention_dropout_rate}; set it to 0 or use attention_impl='einsum'."
            )
        if impl != "einsum" and self.d_k != self.d_v:
            raise ValueError(
                f"ModelConfig.attention_impl={impl!r} needs keys and values of one size, but d_k={self.d_k} "
                f"(key_dim) and d_v={self.d_v} (value_dim); use attention_impl='einsum'."
            )
        if impl == "cudnn":
            if self.dtype not in (jnp.bfloat16, jnp.float16):
                raise ValueError(
                    f"ModelConfig.attention_impl='cudnn' needs bfloat16 or float16 activations, not "
                    f"dtype={self.dtype}; set dtype='bfloat16' or use attention_impl='xla'."
                )
            if self.d_k % 8:
                raise ValueError(
                    f"ModelConfig.attention_impl='cudnn' needs head_dim (d_k = d_v) a multiple of 8, not "
                    f"{self.d_k}; change num_heads, key_dim and value_dim, or use attention_impl='xla'."
                )

    def _validate(self) -> None:
        positive = ("vocab_size", "d_model", "num_heads", "d_ff", "max_len")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}.")
        for name in ("num_encoder_layers", "num_decoder_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"ModelConfig.{name} must be a positive integer (a stack needs a layer), got {value!r}."
                )
        for name in ("key_dim", "value_dim"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(
                    f"ModelConfig.{name} must be a positive integer or None (= d_model / num_heads), got {value!r}."
                )
        if (self.key_dim is None or self.value_dim is None) and self.d_model % self.num_heads:
            raise ValueError(
                f"ModelConfig.d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
                f"choose num_heads among the divisors of d_model, or set both key_dim and value_dim "
                f"(d_k and d_v default to d_model / num_heads, §3.2.2)."
            )
        for name in ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"ModelConfig.{name}={value} must lie in [0, 1).")
        if self.norm_position not in NORM_POSITIONS:
            raise ValueError(
                f"ModelConfig.norm_position={self.norm_position!r} is unknown; use one of {NORM_POSITIONS}."
            )
        if self.position_encoding not in POSITION_KINDS:
            raise ValueError(
                f"ModelConfig.position_encoding={self.position_encoding!r} is unknown; use one of {POSITION_KINDS}."
            )
        if self.sinusoid_layout not in SINUSOID_LAYOUTS:
            raise ValueError(
                f"ModelConfig.sinusoid_layout={self.sinusoid_layout!r} is unknown; use one of {SINUSOID_LAYOUTS}."
            )
        if self.position_encoding == "sinusoidal" and self.d_model % 2:
            raise ValueError(
                f"ModelConfig.d_model={self.d_model} must be even for sinusoidal positions (sin/cos pairs)."
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"ModelConfig.activation={self.activation!r} is unknown; use one of {ACTIVATIONS}.")
        self._validate_attention_impl()
        if self.layer_norm_epsilon <= 0:
            raise ValueError(f"ModelConfig.layer_norm_epsilon={self.layer_norm_epsilon} must be positive.")
        ids = {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        for name, value in ids.items():
            if not 0 <= value < self.vocab_size:
                raise ValueError(f"ModelConfig.{name}={value} must lie in [0, vocab_size={self.vocab_size}).")
        if self.eos_id in (self.pad_id, self.bos_id):
            raise ValueError(f"ModelConfig.eos_id must differ from pad_id and bos_id, got {ids}.")


def base(**overrides) -> ModelConfig:
    """Table 3, 'base': N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1 (about 65M parameters)."""
    return ModelConfig(**overrides)


def big(**overrides) -> ModelConfig:
    """Table 3, 'big': N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (about 213M parameters).

    The paper used P_drop=0.1 for big on EN-FR; pass dropout_rate=0.1 for that row.
    """
    values = dict(d_model=1024, d_ff=4096, num_heads=16, dropout_rate=0.3)
    return ModelConfig(**{**values, **overrides})


def tiny(**overrides) -> ModelConfig:
    """A small model for tests, the demo and laptops (same shape rules, a fraction of the size)."""
    values = dict(
        vocab_size=512,
        d_model=64,
        num_heads=4,
        d_ff=256,
        num_encoder_layers=2,
        num_decoder_layers=2,
        max_len=128,
    )
    return ModelConfig(**{**values, **overrides})


PRESETS = {"base": base, "big": big, "tiny": tiny}
