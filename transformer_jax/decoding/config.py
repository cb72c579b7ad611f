"""How to decode (§6.1): DecodeConfig, the experiment's `decode` section, and the length rules it sets."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

import jax.numpy as jnp
import numpy as np

from transformer_jax.errors import ConfigError
from transformer_jax.section import Section, positive_int


@dataclasses.dataclass(frozen=True)
class DecodeConfig(Section):
    """How to decode. §6.1: "beam search with a beam size of 4 and length penalty alpha = 0.6 ... maximum
    output length to input length + 50, but terminate early when possible"."""

    section: ClassVar[str] = "decode"
    _positive: ClassVar[tuple[str, ...]] = ("beam_size", "num_samples")

    # Each field's `help` is its command-line help (`--beam-size`, ... in translate / evaluate).
    beam_size: int = dataclasses.field(default=4, metadata={"help": "hypotheses kept (§6.1: 4)"})
    alpha: float = dataclasses.field(
        default=0.6, metadata={"help": "GNMT length penalty ((5 + |Y|) / 6) ** alpha, |Y| counting the EOS (§6.1: 0.6)"}
    )
    length_penalty: Literal["gnmt", "hf"] = dataclasses.field(
        default="gnmt",
        metadata={
            "help": "beam scores divide log P by 'gnmt' ((5 + |Y|) / 6) ** alpha, or by 'hf' |Y| ** alpha "
            "(transformers' generate, alpha = its length_penalty)"
        },
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
    num_samples: int = dataclasses.field(default=1, metadata={"help": "sampling: samples drawn per source sentence"})
    temperature: float = dataclasses.field(
        default=1.0, metadata={"help": "sampling: logits divided by this (0 = greedy, 1 = the model's distribution)"}
    )
    top_k: int = dataclasses.field(default=0, metadata={"help": "sampling: draw among the k most probable (0 = all)"})
    top_p: float = dataclasses.field(
        default=1.0, metadata={"help": "sampling: draw among the fewest most probable tokens of mass >= p (1 = all)"}
    )
    seed: int = dataclasses.field(
        default=0, metadata={"help": "sampling: with a sentence's line number, decides its draws"}
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
        if not self.temperature >= 0:
            raise ConfigError(f"decode.temperature must be >= 0 (0: greedy), got {self.temperature!r}.")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"decode.top_k must be a non-negative integer (0: no cut), got {self.top_k!r}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"decode.top_p must lie in (0, 1] (1: no cut), got {self.top_p!r}.")
        if self.max_decode_len is not None and not positive_int(self.max_decode_len):
            raise ConfigError(f"decode.max_decode_len must be None or a positive integer, got {self.max_decode_len!r}.")


# A finite stand-in for log(0): -inf would turn into NaN in one-hot gathers (0 * -inf) and in differences.
NEG_INF = -1.0e9


def length_penalty(length, alpha: float, kind: str = "gnmt"):
    """The length penalty lp(Y) that beam search divides log P(Y | X) by: 'gnmt' ((5 + |Y|) / 6) ** alpha (Wu et
    al. 2016), as used in §6.1, or 'hf' |Y| ** alpha (transformers' generate, whose length_penalty is alpha).
    Both are monotone in |Y|.

    `length` is |Y|, the number of generated tokens INCLUDING the final EOS (tensor2tensor's convention, and
    transformers' too; the BOS fed to the decoder is not counted). A hypothesis cut at the maximum length has
    |Y| = that length.
    """
    length = jnp.asarray(length, jnp.float32)
    return (length if kind == "hf" else (5.0 + length) / 6.0) ** alpha


def resolve_max_decode_len(
    source_width: int, config: DecodeConfig, max_decode_len: int | None, model_max_len: int | None
) -> int:
    """The static length of the output buffer (a Python int, so that jit sees a fixed shape).

    Explicit values (argument, then config) win and must fit the model's position table; the default
    `source_width + extra_length` is clipped to it.
    """
    explicit = max_decode_len if max_decode_len is not None else config.max_decode_len
    if explicit is not None:
        if not isinstance(explicit, (int, np.integer)) or explicit < 1:
            raise ValueError(f"max_decode_len must be a positive integer, got {explicit!r}.")
        if model_max_len is not None and explicit > model_max_len:
            raise ValueError(
                f"max_decode_len={explicit} exceeds the model's position table (ModelConfig.max_len="
                f"{model_max_len}); lower max_decode_len or use a model with a larger max_len."
            )
        return int(explicit)
    length = source_width + config.extra_length
    return int(min(length, model_max_len) if model_max_len is not None else length)


def per_sentence_limits(inputs: jnp.ndarray, pad_id: int, extra_length: int, max_decode_len: int) -> jnp.ndarray:
    """[batch] output length limits: non-pad source length + extra_length, within [1, max_decode_len].

    Per sentence rather than per padded batch, so that a sentence decodes the same alone or in a batch.
    """
    source_lengths = jnp.sum(inputs != pad_id, axis=-1).astype(jnp.int32)  # [batch]
    return jnp.clip(source_lengths + extra_length, 1, max_decode_len)


def cache_lengths(max_decode_len: int, first: int) -> tuple[int, ...]:
    """The lengths the decode cache grows through (driver.growing_cache_loop; decode_in_segments grows the same way):
    `first`, doubled while the double stays below max_decode_len, then max_decode_len; (max_decode_len,) when first
    is 0 or not below it."""
    if first <= 0 or first >= max_decode_len:
        return (max_decode_len,)
    lengths = [first]
    while lengths[-1] * 2 < max_decode_len:
        lengths.append(lengths[-1] * 2)
    return (*lengths, max_decode_len)
