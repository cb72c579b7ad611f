"""Validation during training: the loss of the validation batches, and BLEU / chrF of decoded validation pairs.

On several processes every process must call both functions (they run collectives); each process feeds its own
rows of every validation batch, and only process 0 decodes for BLEU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import Mesh

from transformer_jax import parallel
from transformer_jax.config import ModelConfig
from transformer_jax.decoding import DecodeConfig
from transformer_jax.evaluation import evaluate_pairs
from transformer_jax.metrics import Scores
from transformer_jax.train import loss as loss_lib
from transformer_jax.translate import Translator


def validation_loss(
    eval_step: Callable,
    params: Any,
    batches: Sequence[dict],
    mesh: Mesh,
    rules: parallel.Rules = parallel.DEFAULT_RULES,
    shard: tuple[int, int] = (0, 1),
) -> dict:
    """Token-weighted means over all validation batches (loss, nll, perplexity, accuracy).

    batches: whole (global) host batches; shard: this process's (shard_index, shard_count) of their rows.
    """
    totals = {"loss": 0.0, "nll": 0.0, "correct": 0.0, "tokens": 0.0}
    outputs = [
        eval_step(params, parallel.global_batch(parallel.local_rows(batch, *shard), mesh, rules)) for batch in batches
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
