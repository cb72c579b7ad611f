"""Parallel text sources, the shared SentencePiece vocabulary, and token-budget batches.

source = make_source("builtin")                      # or "tfds", "local", "multi30k"
tokenizer = load_or_train_tokenizer(workdir, source.pairs("train"), vocab_size=8000)
batches = TrainBatches(tokenizer.encode_pairs(source.pairs("train")), tokens_per_batch=25_000, max_len=256)
"""

from transformer_jax.data.batching import Batch, TrainBatches, eval_batches
from transformer_jax.data.builtin_corpus import BuiltinCorpusSource, generate_corpus
from transformer_jax.data.local_files import MULTI30K_SPLIT_PREFIXES, LocalFilesSource
from transformer_jax.data.pairs import SPLITS, Pair, ParallelSource, SkipCounts
from transformer_jax.data.sources import make_source
from transformer_jax.data.tfds_source import WMT14_EN_DE, TfdsSource
from transformer_jax.data.tokenizer import Tokenizer, load_or_train_tokenizer

__all__ = [
    "Batch",
    "BuiltinCorpusSource",
    "LocalFilesSource",
    "MULTI30K_SPLIT_PREFIXES",
    "Pair",
    "ParallelSource",
    "SPLITS",
    "SkipCounts",
    "TfdsSource",
    "Tokenizer",
    "TrainBatches",
    "WMT14_EN_DE",
    "eval_batches",
    "generate_corpus",
    "load_or_train_tokenizer",
    "make_source",
]
