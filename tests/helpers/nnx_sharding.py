"""NNX and Linen Transformers initialised sharded on 8 simulated CPU devices; prints one JSON line.

    python tests/helpers/nnx_sharding.py

Launched as a subprocess by tests/test_nnx.py (the device count must be fixed before JAX is imported). For each
layout, the mesh axes of every parameter as placed by `transformer_jax.nnx.sharded` and as `sharding.tree_shardings`
lays out the Linen model's parameters (what the train step's jitted init places them by), and the largest difference
between the sharded NNX model's logits and the one-device Linen model's on the same parameters.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx, traverse_util  # noqa: E402

import transformer_jax.nnx as tnnx  # noqa: E402
from transformer_jax import (
    sharding,  # noqa: E402
)
from transformer_jax.config import tiny  # noqa: E402
from transformer_jax.model import Transformer  # noqa: E402

LAYOUTS = {
    "data8": ({"data": 8}, sharding.DEFAULT_RULES),
    "fsdp4_data2": ({"data": 2, "fsdp": 4}, sharding.FSDP_RULES),
    "tensor2_data4": ({"data": 4, "tensor": 2}, sharding.TENSOR_RULES),
    "fsdp2_tensor2_data2": ({"data": 2, "fsdp": 2, "tensor": 2}, sharding.FSDP_TENSOR_RULES),
}


def model_config():
    # Every kind of parameter: unshared output projection, learned positions, attention biases.
    return tiny(
        dropout_rate=0.0,
        num_encoder_layers=1,
        num_decoder_layers=1,
        share_embeddings=False,
        position_encoding="learned",
        attention_bias=True,
    )


def mesh_axes(params, shardings) -> dict[str, list]:
    """{'encoder/layer_0/ffn/wi/kernel': [mesh axes of each dimension], ...} of arrays (shapes) and their shardings."""
    flat_params, flat_shardings = traverse_util.flatten_dict(params), traverse_util.flatten_dict(shardings)

    def entries(path):
        spec = flat_shardings[path].spec
        spec = list(spec) + [None] * (flat_params[path].ndim - len(spec))
        return [list(entry) if isinstance(entry, tuple) else entry for entry in spec]

    return {"/".join(path): entries(path) for path in flat_params}


def main():
    cfg = model_config()
    linen = Transformer(cfg)
    src = jnp.array(np.random.default_rng(0).integers(3, cfg.vocab_size, (8, 7)), jnp.int32).at[:, 5:].set(0)
    tgt = jnp.array(np.random.default_rng(1).integers(3, cfg.vocab_size, (8, 6)), jnp.int32).at[:, 4:].set(0)
    linen_boxed = jax.eval_shape(lambda key: linen.init(key, src[:1, :1], tgt[:1, :1]), jax.random.key(0))
    out = {"device_count": jax.device_count(), "layouts": {}}
    for name, (shape, rules) in LAYOUTS.items():
        mesh = sharding.make_mesh(shape)
        model = tnnx.sharded(lambda: tnnx.Transformer(cfg, rngs=nnx.Rngs(0)), mesh, rules)
        _, nnx_params = tnnx.as_linen(model)
        linen_shardings = sharding.tree_shardings(linen_boxed, mesh, rules)["params"]
        logits = nnx.jit(lambda m, s, t: m(s, t))(model, src, tgt)
        host_params = jax.device_get(nnx_params)
        reference = linen.apply({"params": host_params}, jax.device_get(src), jax.device_get(tgt))
        out["layouts"][name] = {
            "nnx": mesh_axes(nnx_params, jax.tree.map(lambda leaf: leaf.sharding, nnx_params)),
            "linen": mesh_axes(nn.unbox(linen_boxed)["params"], linen_shardings),
            "max_logit_diff": float(np.max(np.abs(np.asarray(logits) - np.asarray(reference)))),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
