"""The length rules of decoding (§6.1); DecodeConfig, the decode section of the experiment config, is re-exported."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from transformer_jax.experiment import DecodeConfig as DecodeConfig  # the `decode` section

# A finite stand-in for log(0): -inf would turn into NaN in one-hot gathers (0 * -inf) and in differences.
NEG_INF = -1.0e9


def length_penalty(length, alpha: float):
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016), as used in §6.1.

    `length` is |Y|, the number of generated tokens INCLUDING the final EOS (tensor2tensor's convention;
    the BOS fed to the decoder is not counted). A hypothesis cut at the maximum length has |Y| = that length.
    """
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


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
