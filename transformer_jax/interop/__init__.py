"""Bridges to other frameworks. Importing this package never needs them.

- `transformer_jax.interop.torch_reference`: a PyTorch reference of the same model built on `torch.nn`
  Transformer layers, and its greedy decoder;
- `transformer_jax.interop.torch`: exact parameter conversion both ways (and the reference, re-exported).
Both need the extra: `pip install 'transformer-jax[torch]'`.

The names below are loaded from `transformer_jax.interop.torch` on first use, so
`from transformer_jax.interop import export_torch_state_dict` works, and fails with an install hint only
when torch is absent.
"""

from __future__ import annotations

import importlib

_TORCH_NAMES = (
    "TorchTransformer",
    "ConversionError",
    "flax_to_torch_state_dict",
    "torch_to_flax_params",
    "export_torch_state_dict",
    "import_torch_state_dict",
    "torch_greedy_decode",
)

__all__ = list(_TORCH_NAMES)


def __getattr__(name: str):
    if name in _TORCH_NAMES:
        module = importlib.import_module("transformer_jax.interop.torch")
        return getattr(module, name)
    raise AttributeError(f"module 'transformer_jax.interop' has no attribute {name!r}")
