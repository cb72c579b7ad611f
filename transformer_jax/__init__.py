"""transformer_jax: the original Transformer (Vaswani et al. 2017) in JAX/Flax."""

from importlib import metadata as _metadata

from transformer_jax.config import ModelConfig, base, big, tiny
from transformer_jax.model import Transformer

try:
    __version__ = _metadata.version("transformer-jax")
except _metadata.PackageNotFoundError:  # a source tree that was not installed
    __version__ = "0+unknown"


def load(workdir, checkpoint=None, **options):
    """A ready Translator for a trained workdir: `load("runs/tiny", "averaged").translate(["..."])`.

    checkpoint: None (the latest), a step, 'averaged' or 'imported'; options go to `Translator` (decode_config,
    method='beam' | 'greedy', batch_size, ...). For research use, the translator holds `.model` (the Flax
    Transformer), `.model_config`, `.params` and `.tokenizer`.
    """
    from transformer_jax.translate import Translator

    return Translator.from_workdir(workdir, checkpoint, **options)


__all__ = ["ModelConfig", "Transformer", "base", "big", "tiny", "load", "__version__"]
