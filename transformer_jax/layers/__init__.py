"""Blocks that stand alone in any Flax model, and the key/value caches that are attention's decoding state."""

from transformer_jax.layers.attention import MultiHeadAttention, attention_weights, dot_product_attention
from transformer_jax.layers.embedding import PositionalEncoding, TokenEmbedding, sinusoidal_table
from transformer_jax.layers.feedforward import FeedForward
from transformer_jax.layers.kv_cache import KVCache, Lineage, MemoryCache
from transformer_jax.layers.masks import causal_mask, combine_masks, padding_mask, segment_mask

__all__ = [
    "FeedForward",
    "KVCache",
    "Lineage",
    "MemoryCache",
    "MultiHeadAttention",
    "PositionalEncoding",
    "TokenEmbedding",
    "attention_weights",
    "causal_mask",
    "combine_masks",
    "dot_product_attention",
    "padding_mask",
    "segment_mask",
    "sinusoidal_table",
]
