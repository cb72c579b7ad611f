"""A run's batches, built in one place: this process's training batches and the validation split, from the source
and the run's tokenizer (data/tokenizer.load_or_train_shared_tokenizer).

    data = build_run_data(source, tokenizer, experiment.data, seed, shard=(index, count), batch_multiple=8)
    next(data.batches) -> {name: int32 [rows, length]}          data.valid: the validation batches, in order
    validation_batches(tokenizer, pairs, experiment.data)          the same validation batches, alone
"""

from __future__ import annotations

from typing import Any, NamedTuple

from transformer_jax.data.batching import Batch, TrainBatches, eval_batches
from transformer_jax.data.pairs import Pair, ParallelSource
from transformer_jax.data.prepared import PreparedPairs
from transformer_jax.data.tokenizer import AnyTokenizer, Tokenizer
from transformer_jax.experiment import DataConfig


class RunData(NamedTuple):
    batches: TrainBatches  # this process's rows of every training batch; state() / restore() for resume
    valid_pairs: list[Pair]  # the validation split as text (BLEU)
    valid: list[Batch]  # the validation split as batches (loss), at most data.max_eval_batches
    skipped: dict[str, str]  # split -> how many pairs its source skipped, where it skipped any


def build_run_data(
    source: ParallelSource,
    tokenizer: AnyTokenizer,
    data: DataConfig,
    seed: int,
    *,
    shard: tuple[int, int] = (0, 1),
    batch_multiple: int = 1,
) -> RunData:
    """The training pairs as token-budget batches (`shard`: this process's (index, count) of every batch's rows; each
    batch a multiple of `batch_multiple` rows) and the validation split as text and as batches."""
    if data.prepared:
        pairs: Any = PreparedPairs(data.prepared)  # checked against the run: prepared.check_prepared
    elif data.tokenizer_sampling:  # load_or_train_shared_tokenizer refuses it for an imported Marian tokenizer
        assert isinstance(tokenizer, Tokenizer), "segmentation sampling needs the run's own SentencePiece model"
        pairs = tokenizer.epoch_sampler(source.pairs("train"), data.tokenizer_sampling, seed)
    else:
        pairs = tokenizer.encode_pairs(source.pairs("train"))
    batches = TrainBatches(
        pairs,
        tokens_per_batch=data.tokens_per_batch,
        max_len=data.max_len,
        seed=seed,
        bucket_boundaries=tuple(data.bucket_boundaries) or None,
        batch_multiple=batch_multiple,
        pack=data.pack,
        shard_index=shard[0],
        shard_count=shard[1],
        **_special_ids(tokenizer),
    )
    valid_pairs = list(source.pairs("validation"))
    skipped = {
        split: f"{counts.empty} empty, {counts.too_long} too long (kept {counts.kept})"
        for split, counts in getattr(source, "skipped", {}).items()
        if counts.empty or counts.too_long
    }
    return RunData(batches, valid_pairs, validation_batches(tokenizer, valid_pairs, data), skipped)


def validation_batches(tokenizer: AnyTokenizer, pairs: list[Pair], data: DataConfig) -> list[Batch]:
    """The validation `pairs` as batches for the loss, in order: data.eval_batch_size rows each, at most
    data.max_eval_batches of them."""
    batches = eval_batches(
        tokenizer.encode_pairs(pairs),
        batch_size=data.eval_batch_size,
        max_len=data.max_len,
        bucket_boundaries=tuple(data.bucket_boundaries) or None,
        **_special_ids(tokenizer),
    )
    return [batch for _, batch in batches][: data.max_eval_batches or None]


def _special_ids(tokenizer: AnyTokenizer) -> dict[str, int]:
    return dict(pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id)
