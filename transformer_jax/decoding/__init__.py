"""Decoding: greedy and beam search over the Transformer's key/value cache (paper §6.1).

Public API:
  greedy_decode(model, params, inputs, *, max_decode_len=None, config=None) -> (tokens, lengths)
  beam_search(model, params, inputs, *, beam_size=None, alpha=None, max_decode_len=None, config=None)
      -> (sequences [batch, beam, len], scores [batch, beam]), best first
  DecodeConfig: beam 4, alpha 0.6, max length = source length + 50 (§6.1)
The searches themselves (greedy_search, beam_search_core) take any step function, see cache.py; the cache of
each attention layer (KVCache, MemoryCache) is in kv_cache.py.
"""

from transformer_jax.decoding.beam import beam_search, beam_search_core
from transformer_jax.decoding.cache import (
    cache_shardings,
    constrain_cache,
    init_cache,
    reorder_cache,
    transformer_step_fn,
    uncached_step_fn,
)
from transformer_jax.decoding.config import DecodeConfig, length_penalty
from transformer_jax.decoding.greedy import greedy_decode, greedy_search
from transformer_jax.decoding.kv_cache import KVCache, MemoryCache, gather_beams

__all__ = [
    "DecodeConfig",
    "KVCache",
    "MemoryCache",
    "beam_search",
    "beam_search_core",
    "cache_shardings",
    "constrain_cache",
    "gather_beams",
    "greedy_decode",
    "greedy_search",
    "init_cache",
    "length_penalty",
    "reorder_cache",
    "transformer_step_fn",
    "uncached_step_fn",
]
