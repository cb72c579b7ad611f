"""Validation during training: the loss of the validation batches, and BLEU / chrF of decoded validation pairs; each
logged as a run log row and a line (`log_loss`, `log_bleu`).

On several processes every process must call both functions (they run collectives); each process feeds its own
rows of every validation batch, and only process 0 decodes for BLEU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import Mesh

from transformer_jax import sharding
from transformer_jax.config import ModelConfig
from transformer_jax.decoding import DecodeConfig
from transformer_jax.evaluation import evaluate_pairs
from transformer_jax.scoring import Scores
from transformer_jax.train import loss as loss_lib
from transformer_jax.train.progress import ProgressLog
from transformer_jax.translate import Translator


def validation_loss(
    eval_step: Callable,
    params: Any,
    batches: Sequence[dict],
    mesh: Mesh,
    rules: sharding.Rules = sharding.DEFAULT_RULES,
    shard: tuple[int, int] = (0, 1),
) -> dict:
    """Token-weighted means over all validation batches (loss, nll, perplexity, accuracy).

    batches: whole (global) host batches; shard: this process's (shard_index, shard_count) of their rows.
    """
    totals = {"loss": 0.0, "nll": 0.0, "correct": 0.0, "tokens": 0.0}
    outputs = [
        eval_step(params, sharding.global_batch(sharding.local_rows(batch, *shard), mesh, rules)) for batch in batches
    ]
    for sums in jax.device_get(outputs):
        for key in totals:
            totals[key] += float(sums[key])
    return loss_lib.summarize(totals)


def validation_bleu(
    model_cfg: ModelConfig,
    params: Any,
    tokenizer,
    pairs: Sequence[tuple[str, str]],
    decode_config: DecodeConfig,
    method: str,
) -> Scores | None:
    """sacreBLEU scores of `method` ('greedy' | 'beam') translations of raw (source, reference) pairs.

    Returns None on processes other than 0. With several processes the parameters are first gathered whole onto
    every process (a collective), then process 0 decodes alone on its local devices.
    """
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        params = multihost_utils.process_allgather(params, tiled=True)
        if jax.process_index() != 0:
            return None
        params = jax.device_put(params, jax.local_devices()[0])
    translator = Translator(model_cfg, params, tokenizer, decode_config=decode_config, method=method)
    return evaluate_pairs(translator, pairs).scores


def log_loss(log: ProgressLog, update: int, metrics: dict) -> None:
    """The 'eval' row of `validation_loss`'s metrics at `update`, and its line."""
    log.log("eval", update, metrics)
    log.message(
        f"update {update}: validation loss {metrics['loss']:.4f}, NLL {metrics['nll']:.4f}, "
        f"perplexity {metrics['perplexity']:.2f}, accuracy {metrics['accuracy']:.3f}"
    )


def log_bleu(log: ProgressLog, kind: str, update: int, method: str, scores: Scores) -> dict:
    """A `kind` row ('bleu', 'final_bleu') of `validation_bleu`'s scores of `method` at `update`, and its line;
    returns the row's scores."""
    values = {
        "bleu": scores.bleu,
        "bleu_lowercase": scores.bleu_lowercase,
        "chrf": scores.chrf,
        "sentences": scores.sentences,
    }
    log.log(kind, update, dict(values, method=method))
    log.message(
        f"update {update}: validation {method} BLEU {scores.bleu:.2f} (lowercased {scores.bleu_lowercase:.2f}), "
        f"chrF {scores.chrf:.2f} ({scores.sentences} sentences)"
    )
    return values
