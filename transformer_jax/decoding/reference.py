"""Scoring given translations: log P(target | source) token by token, under teacher forcing (fairseq's
`--score-reference`), for reranking and analysis. The same computation as the training loss's NLL without label
smoothing (train/loss.py), and as the scores the searches add up, one decoder pass instead of one per token.
"""

from __future__ import annotations

import functools
from typing import cast

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.decoding.steps import as_params


@functools.partial(jax.jit, static_argnames=("model",))
def _token_log_probs(model: nn.Module, params, inputs: jnp.ndarray, targets: jnp.ndarray) -> jnp.ndarray:
    cfg = model.config
    bos = jnp.full((targets.shape[0], 1), cfg.bos_id, jnp.int32)  # [batch, 1]
    decoder_inputs = jnp.concatenate([bos, targets[:, :-1]], axis=1)  # [batch, tgt_len]: shifted right
    logits = cast(jnp.ndarray, model.apply({"params": params}, inputs, decoder_inputs))  # [batch, tgt_len, vocab]
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(log_probs, targets[:, :, None], axis=2)[:, :, 0]  # [batch, tgt_len]
    return jnp.where(targets != cfg.pad_id, picked, 0.0)


def token_log_probs(model: nn.Module, params, inputs, targets) -> jnp.ndarray:
    """[batch, tgt_len] log p(targets[:, t] | inputs, targets[:, :t]), 0 at padding.

    inputs: [batch, src_len] source ids + EOS, pad after; targets: [batch, tgt_len] target ids + EOS, pad after
    (as the training batches hold them). Sum a row for log P(target | source).
    """
    return _token_log_probs(model, as_params(params), jnp.asarray(inputs, jnp.int32), jnp.asarray(targets, jnp.int32))
