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

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


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


def cross_entropy_sums(
    logits: jnp.ndarray,
    targets: jnp.ndarray,
    *,
    label_smoothing: float,
    pad_id: int = 0,
) -> LossSums:
    """Label-smoothed cross-entropy summed over the target tokens that are not `pad_id`.

    logits: [batch, length, vocab] (any float dtype; promoted to float32);
    targets: [batch, length] int ids.
    `correct` counts tokens whose gold logit is the largest (a tie with another token counts as correct).
    """
    mask = (targets != pad_id).astype(jnp.float32)  # [batch, length]
    loss, nll, correct = _token_losses(logits.astype(jnp.float32), targets, mask, label_smoothing)
    return LossSums(loss=loss, nll=nll, correct=correct, tokens=jnp.sum(mask))


def _forward_terms(logits, targets, mask, label_smoothing):
    """Sums of the smoothed loss, the NLL and correct tokens, from per-row statistics only.

    -log p(v) = logsumexp(logits) - logit(v), so no [batch, length, vocab] log-probability array is made.
    """
    max_logit = jnp.max(logits, axis=-1)  # [batch, length]
    log_z = max_logit + jnp.log(jnp.sum(jnp.exp(logits - max_logit[..., None]), axis=-1))  # [batch, length]
    gold = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]  # [batch, length]
    nll = log_z - gold
    mean_neg_log_prob = log_z - jnp.mean(logits, axis=-1)  # the uniform eps/V part
    smoothed = (1.0 - label_smoothing) * nll + label_smoothing * mean_neg_log_prob
    correct = (gold >= max_logit).astype(jnp.float32)
    sums = (jnp.sum(smoothed * mask), jnp.sum(nll * mask), jnp.sum(correct * mask))
    return sums, log_z


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _token_losses(logits, targets, mask, label_smoothing):
    return _forward_terms(logits, targets, mask, label_smoothing)[0]


def _token_losses_fwd(logits, targets, mask, label_smoothing):
    sums, log_z = _forward_terms(logits, targets, mask, label_smoothing)
    return sums, (logits, targets, mask, log_z)


def _token_losses_bwd(label_smoothing, residuals, cotangents):
    """One fused pass: d loss / d logits = mask * (p - q), d nll / d logits = mask * (p - onehot(gold))."""
    logits, targets, mask, log_z = residuals
    d_loss, d_nll, _ = cotangents
    vocab_size = logits.shape[-1]
    probs = jnp.exp(logits - log_z[..., None])  # [batch, length, vocab]
    is_gold = lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1) == targets[..., None]
    gold_weight = (d_loss * (1.0 - label_smoothing) + d_nll) * mask  # [batch, length]
    probs_weight = (d_loss + d_nll) * mask
    d_logits = (
        probs * probs_weight[..., None]
        - jnp.where(is_gold, gold_weight[..., None], 0.0)
        - (d_loss * label_smoothing / vocab_size) * mask[..., None]
    )
    zeros = np.zeros(targets.shape, dtype=jax.dtypes.float0)
    return d_logits, zeros, jnp.zeros_like(mask)


_token_losses.defvjp(_token_losses_fwd, _token_losses_bwd)


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
