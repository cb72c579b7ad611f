"""Initializers annotated with logical axis names, so sharding rules (sharding.py) can place them."""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn


def kernel_init(axes: Sequence[str]):
    """Glorot-uniform kernel init (as tensor2tensor) carrying the kernel's logical axis names.

    Multi-axis kernels (DenseGeneral) are initialised flat as [fan_in, fan_out], then reshaped.
    """
    return nn.with_logical_partitioning(nn.initializers.xavier_uniform(), tuple(axes))


def bias_init(axes: Sequence[str]):
    """Zero bias init carrying the bias's logical axis names."""
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), tuple(axes))
