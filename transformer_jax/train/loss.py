"""Label-smoothed cross-entropy over non-pad target tokens (paper §5.4), returned as sums.

Smoothed target distribution (the same as PyTorch's `CrossEntropyLoss(label_smoothing=eps)`):

    q(v) = (1 - eps) * [v == gold] + eps / V          for every v in the vocabulary of size V,

so the gold token gets (1 - eps) + eps/V and every other token (pad included) gets eps/V. The per-token loss
is the cross-entropy H(q, p) = -sum_v q(v) log p(v) = (1 - eps) * NLL + eps * mean_v(-log p(v)).
It is *not* shifted by the entropy of q, so its minimum is H(q) > 0 for eps > 0 (tensor2tensor and the Flax
WMT example spread eps/(V-1) over the non-gold tokens and subtract that constant instead); `nll` is the
plain negative log-likelihood of the gold token, whose exp is the perplexity.

All losses are computed in float32 and returned as *sums* with the token count, so that the mean is taken
once over the global batch: micro-batches of a gradient accumulation and shards of a data-parallel batch
are summed first and divided by the total number of target tokens at the end.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp


class LossSums(NamedTuple):
    """Sums over the real (non-pad) target tokens of a batch; all float32 scalars."""

    loss: jnp.ndarray  # label-smoothed cross-entropy, summed
    nll: jnp.ndarray  # -log p(gold), summed
    correct: jnp.ndarray  # argmax == gold, counted
    tokens: jnp.ndarray  # number of real target tokens


def smoothed_targets(targets: jnp.ndarray, vocab_size: int, label_smoothing: float) -> jnp.ndarray:
    """[batch, length] ids -> [batch, length, vocab] distribution (1-eps)*onehot + eps/V (see module doc)."""
    onehot = jax.nn.one_hot(targets, vocab_size, dtype=jnp.float32)
    return (1.0 - label_smoothing) * onehot + label_smoothing / vocab_size


def cross_entropy_sums(logits: jnp.ndarray, targets: jnp.ndarray, *, label_smoothing: float,
                       pad_id: int = 0, weights: jnp.ndarray | None = None) -> LossSums:
    """Label-smoothed cross-entropy summed over the target tokens that are not `pad_id`.

    logits: [batch, length, vocab] (any float dtype; promoted to float32);
    targets: [batch, length] int ids; weights: optional [batch, length] extra 0/1 mask (multiplied in).
    """
    logits = logits.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)  # [batch, length, vocab]
    mask = (targets != pad_id).astype(jnp.float32)  # [batch, length]
    if weights is not None:
        mask = mask * weights.astype(jnp.float32)
    nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # [batch, length]
    mean_neg_log_prob = -jnp.mean(log_probs, axis=-1)  # [batch, length]: the uniform eps/V part
    smoothed = (1.0 - label_smoothing) * nll + label_smoothing * mean_neg_log_prob
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return LossSums(
        loss=jnp.sum(smoothed * mask), nll=jnp.sum(nll * mask), correct=jnp.sum(correct * mask),
        tokens=jnp.sum(mask),
    )


def summarize(sums: dict | LossSums) -> dict:
    """Means from (possibly accumulated) sums: loss, nll, perplexity = exp(nll), accuracy. Works on numpy too."""
    sums = sums._asdict() if isinstance(sums, LossSums) else sums
    tokens = max(float(sums["tokens"]), 1.0)
    nll = float(sums["nll"]) / tokens
    return {
        "loss": float(sums["loss"]) / tokens,
        "nll": nll,
        "perplexity": math.exp(min(nll, 80.0)),
        "accuracy": float(sums["correct"]) / tokens,
        "tokens": float(sums["tokens"]),
    }
