"""Decoding: greedy and beam search over the Transformer's key/value cache (paper §6.1).

Public API:
  greedy_decode(model, params, inputs, *, max_decode_len=None, config=None) -> (tokens, lengths)
  beam_search(model, params, inputs, *, beam_size=None, alpha=None, max_decode_len=None, config=None)
      -> (sequences [batch, beam, len], scores [batch, beam]), best first
  sample(model, params, inputs, *, config=None)  (config.num_samples, temperature, top_k, top_p, seed)
      -> (tokens [batch, samples, len], lengths, log_probs): sampled translations (back-translation)
  DecodeConfig: beam 4, alpha 0.6, max length = source length + 50 (§6.1)
Every search takes `prefixes`, target tokens each output starts with.
  token_log_probs(model, params, inputs, targets) -> [batch, tgt_len]: given translations scored, teacher-forced
Every function takes an Ensemble (ensemble.py) and ensemble_params(...) in place of a Transformer and its params.
The searches themselves (greedy_search, beam_search_core) take any step function, see steps.py; the cache of
each attention layer (KVCache, MemoryCache) is a layer's state, in layers/kv_cache.py.
"""

from transformer_jax.decoding.beam import beam_search, beam_search_core
from transformer_jax.decoding.cache import cache_shardings, constrain_cache, reorder_cache
from transformer_jax.decoding.config import DecodeConfig, length_penalty
from transformer_jax.decoding.ensemble import Ensemble, ensemble_params
from transformer_jax.decoding.greedy import greedy_decode, greedy_search
from transformer_jax.decoding.reference import token_log_probs
from transformer_jax.decoding.sampling import SamplingSearch, kept_logits, sample
from transformer_jax.decoding.steps import init_cache, transformer_step_fn, uncached_step_fn
from transformer_jax.layers.kv_cache import KVCache, MemoryCache, gather_beams

__all__ = [
    "DecodeConfig",
    "Ensemble",
    "KVCache",
    "MemoryCache",
    "SamplingSearch",
    "beam_search",
    "beam_search_core",
    "cache_shardings",
    "ensemble_params",
    "constrain_cache",
    "gather_beams",
    "greedy_decode",
    "greedy_search",
    "init_cache",
    "kept_logits",
    "length_penalty",
    "reorder_cache",
    "sample",
    "token_log_probs",
    "transformer_step_fn",
    "uncached_step_fn",
]
