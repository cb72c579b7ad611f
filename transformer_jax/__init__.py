"""transformer_jax: the original Transformer (Vaswani et al. 2017) in JAX/Flax."""

from transformer_jax.config import ModelConfig, base, big, tiny
from transformer_jax.model import Transformer

__all__ = ["ModelConfig", "Transformer", "base", "big", "tiny"]
