"""Exact conversion of parameters between the Flax Transformer and its PyTorch reference, both ways.

`TorchTransformer` (interop/torch_reference.py) is re-exported here, so `interop.torch` is the one import for
both.

State-dict names (torch) <- Flax parameter paths:
  embed.weight                               <- embed/embedding                      [vocab, d_model]
  source_embed.weight, target_embed.weight   <- source_embed/embedding, target_embed/embedding
  output_projection.weight                   <- output_projection/kernel^T           [vocab, d_model]
  {encoder,decoder}.positions.weight         <- {encoder,decoder}/positions/position_embedding (learned)
  encoder.layers.i.self_attn.in_proj_weight  <- [query; key; value] kernels, each [d, h, k] -> [h*k, d]
  encoder.layers.i.self_attn.in_proj_bias    <- [query; key; value] biases [h, k] -> [h*k] (attention_bias)
  encoder.layers.i.self_attn.out_proj.weight <- out/kernel [h, k, d] -> [d, h*k]   (.bias <- out/bias)
  encoder.layers.i.linear1/linear2           <- ffn/wi, ffn/wo (kernel^T, bias)
  encoder.layers.i.norm1/norm2               <- self_attention_norm, ffn_norm (scale -> weight, bias)
  decoder.layers.i.self_attn/multihead_attn  <- self_attention/cross_attention
  decoder.layers.i.norm1/norm2/norm3         <- self_attention_norm/cross_attention_norm/ffn_norm
  {encoder,decoder}.norm                     <- {encoder,decoder}/final_norm (pre-LN only)
Every conversion is a transpose, reshape or concatenation, so a round trip is bitwise exact.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flax import traverse_util
from flax.core import unfreeze
from flax.linen import unbox

from transformer_jax.config import ModelConfig
from transformer_jax.errors import UserError
from transformer_jax.interop.torch_reference import (  # where torch is absent: ImportError with the install hint
    TorchTransformer,
    torch,
    torch_greedy_decode,
)

__all__ = [
    "TorchTransformer",
    "ConversionError",
    "flax_to_torch_state_dict",
    "torch_to_flax_params",
    "export_torch_state_dict",
    "import_torch_state_dict",
    "torch_greedy_decode",
    "parameter_map",
    "check_convertible",
]


# ----------------------------------------------------------------------------------------------------------
# The parameter map
# ----------------------------------------------------------------------------------------------------------


class ConversionError(UserError, ValueError):
    """Parameters do not match the config: missing, unexpected or misshapen entries (named in the message)."""


@dataclasses.dataclass(frozen=True)
class _Entry:
    """One torch tensor and the Flax arrays it is made of (several for the packed in_proj)."""

    torch_key: str
    flax_paths: tuple[str, ...]
    flax_shapes: tuple[tuple[int, ...], ...]
    torch_shape: tuple[int, ...]
    to_torch: Callable[[list[np.ndarray]], np.ndarray]
    to_flax: Callable[[np.ndarray], list[np.ndarray]]


def _copy(flax_path, torch_key, shape):
    return _Entry(torch_key, (flax_path,), (tuple(shape),), tuple(shape), lambda a: a[0], lambda t: [t])


def _transposed(flax_path, torch_key, flax_shape):
    """Flax Dense kernel [in, out] <-> torch Linear weight [out, in]."""
    return _Entry(
        torch_key, (flax_path,), (tuple(flax_shape),), tuple(flax_shape[::-1]), lambda a: a[0].T, lambda t: [t.T]
    )


def check_convertible(config: ModelConfig) -> None:
    """Raises ConversionError where the torch reference cannot hold the model: its nn.MultiheadAttention has
    d_k = d_v = d_model / num_heads, so key_dim and value_dim must be left at (or equal) that default; it has
    none of the Marian options (ModelConfig.marian_options)."""
    if not config.has_paper_head_sizes:
        raise ConversionError(
            f"torch's nn.MultiheadAttention has d_k = d_v = d_model / num_heads, but this model has "
            f"ModelConfig.key_dim={config.key_dim} (d_k={config.d_k}) and value_dim={config.value_dim} "
            f"(d_v={config.d_v}) with d_model={config.d_model}, num_heads={config.num_heads}; only a model with "
            "key_dim and value_dim None (or d_model / num_heads) converts."
        )
    if config.marian_options:
        raise ConversionError(
            f"the torch reference has a ReLU FFN, no logits bias and a bos token of its own, but this model has "
            f"ModelConfig.{', '.join(config.marian_options)} (an imported Marian model); it does not convert."
        )


def _attention_entries(cfg: ModelConfig, flax_prefix: str, torch_prefix: str) -> list[_Entry]:
    d, h, k = cfg.d_model, cfg.num_heads, cfg.head_dim
    names = ("query", "key", "value")
    # kernel [d_model, heads, head_dim] -> [d_model, heads*head_dim] -> torch [heads*head_dim, d_model]
    entries = [
        _Entry(
            f"{torch_prefix}.in_proj_weight",
            tuple(f"{flax_prefix}/{n}/kernel" for n in names),
            ((d, h, k),) * 3,
            (3 * h * k, d),
            lambda arrays: np.concatenate([a.reshape(d, h * k).T for a in arrays], axis=0),
            lambda t: [part.T.reshape(d, h, k) for part in np.split(t, 3, axis=0)],
        )
    ]
    # out kernel [heads, head_dim, d_model] -> [heads*head_dim, d_model] -> torch [d_model, heads*head_dim]
    entries.append(
        _Entry(
            f"{torch_prefix}.out_proj.weight",
            (f"{flax_prefix}/out/kernel",),
            ((h, k, d),),
            (d, h * k),
            lambda a: a[0].reshape(h * k, d).T,
            lambda t: [t.T.reshape(h, k, d)],
        )
    )
    if cfg.attention_bias:
        entries.append(
            _Entry(
                f"{torch_prefix}.in_proj_bias",
                tuple(f"{flax_prefix}/{n}/bias" for n in names),
                ((h, k),) * 3,
                (3 * h * k,),
                lambda arrays: np.concatenate([a.reshape(h * k) for a in arrays]),
                lambda t: [part.reshape(h, k) for part in np.split(t, 3)],
            )
        )
        entries.append(_copy(f"{flax_prefix}/out/bias", f"{torch_prefix}.out_proj.bias", (d,)))
    return entries


def _norm_entries(cfg: ModelConfig, flax_prefix: str, torch_prefix: str) -> list[_Entry]:
    return [
        _copy(f"{flax_prefix}/scale", f"{torch_prefix}.weight", (cfg.d_model,)),
        _copy(f"{flax_prefix}/bias", f"{torch_prefix}.bias", (cfg.d_model,)),
    ]


def _ffn_entries(cfg: ModelConfig, flax_prefix: str, torch_prefix: str) -> list[_Entry]:
    return [
        _transposed(f"{flax_prefix}/wi/kernel", f"{torch_prefix}.linear1.weight", (cfg.d_model, cfg.d_ff)),
        _copy(f"{flax_prefix}/wi/bias", f"{torch_prefix}.linear1.bias", (cfg.d_ff,)),
        _transposed(f"{flax_prefix}/wo/kernel", f"{torch_prefix}.linear2.weight", (cfg.d_ff, cfg.d_model)),
        _copy(f"{flax_prefix}/wo/bias", f"{torch_prefix}.linear2.bias", (cfg.d_model,)),
    ]


def parameter_map(config: ModelConfig) -> list[_Entry]:
    """Every torch state_dict entry of `TorchTransformer(config)` and the Flax parameters behind it
    (ConversionError where torch cannot hold the model, `check_convertible`)."""
    check_convertible(config)
    cfg = config
    entries: list[_Entry] = []
    if cfg.share_embeddings:
        entries.append(_copy("embed/embedding", "embed.weight", (cfg.vocab_size, cfg.d_model)))
    else:
        entries += [
            _copy("source_embed/embedding", "source_embed.weight", (cfg.vocab_size, cfg.d_model)),
            _copy("target_embed/embedding", "target_embed.weight", (cfg.vocab_size, cfg.d_model)),
            _transposed("output_projection/kernel", "output_projection.weight", (cfg.d_model, cfg.vocab_size)),
        ]
    stacks = {
        "encoder": (cfg.num_encoder_layers, [("self_attention", "self_attn", "norm1"), ("ffn", None, "norm2")]),
        "decoder": (
            cfg.num_decoder_layers,
            [
                ("self_attention", "self_attn", "norm1"),
                ("cross_attention", "multihead_attn", "norm2"),
                ("ffn", None, "norm3"),
            ],
        ),
    }
    for stack, (num_layers, sublayers) in stacks.items():
        if cfg.position_encoding == "learned":
            entries.append(
                _copy(f"{stack}/positions/position_embedding", f"{stack}.positions.weight", (cfg.max_len, cfg.d_model))
            )
        for index in range(num_layers):
            flax_layer, torch_layer = f"{stack}/layer_{index}", f"{stack}.layers.{index}"
            for flax_name, torch_attention, torch_norm in sublayers:
                if torch_attention is None:
                    entries += _ffn_entries(cfg, f"{flax_layer}/{flax_name}", torch_layer)
                else:
                    entries += _attention_entries(cfg, f"{flax_layer}/{flax_name}", f"{torch_layer}.{torch_attention}")
                entries += _norm_entries(cfg, f"{flax_layer}/{flax_name}_norm", f"{torch_layer}.{torch_norm}")
        if cfg.norm_position == "pre":
            entries += _norm_entries(cfg, f"{stack}/final_norm", f"{stack}.norm")
    return entries


_HINT = (
    "Check that the ModelConfig matches the one the parameters were made with "
    "(sizes, norm_position, attention_bias, share_embeddings, position_encoding)."
)


def _check_names(kind: str, got: set[str], expected: set[str]) -> None:
    missing, unexpected = sorted(expected - got), sorted(got - expected)
    problems = []
    if missing:
        problems.append(f"missing {kind} parameters: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected {kind} parameters: {', '.join(unexpected)}")
    if problems:
        raise ConversionError("; ".join(problems) + ". " + _HINT)


def _check_shape(kind: str, name: str, got: tuple[int, ...], expected: tuple[int, ...], other: str) -> None:
    if tuple(got) != tuple(expected):
        raise ConversionError(
            f"{kind} parameter '{name}' has shape {tuple(got)} but the config expects {tuple(expected)} "
            f"(it maps to '{other}'). {_HINT}"
        )


def _flax_tree(params: Any) -> dict:
    """Unboxed, unfrozen params; accepts the params tree or a variables dict {'params': tree}."""
    tree = unfreeze(unbox(params))
    if set(tree) == {"params"}:
        tree = tree["params"]
    return tree


def _numpy_to_torch(array: np.ndarray) -> torch.Tensor:
    array = np.ascontiguousarray(array)
    if array.dtype.name == "bfloat16":  # numpy has no native bfloat16; move the bits
        return torch.from_numpy(array.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(array.copy())


def _torch_to_numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes  # a jax dependency

        return tensor.contiguous().view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def flax_to_torch_state_dict(params: Any, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Flax params (boxed or not, or {'params': ...}) -> a state_dict for `TorchTransformer(config)`.

    Also converts anything shaped like the params, e.g. gradients. Raises ConversionError naming every
    missing or unexpected parameter, or the first one with a wrong shape.
    """
    entries = parameter_map(config)
    flat = {"/".join(path): np.asarray(value) for path, value in traverse_util.flatten_dict(_flax_tree(params)).items()}
    _check_names("Flax", set(flat), {path for entry in entries for path in entry.flax_paths})
    state_dict = {}
    for entry in entries:
        for path, shape in zip(entry.flax_paths, entry.flax_shapes):
            _check_shape("Flax", path, flat[path].shape, shape, entry.torch_key)
        state_dict[entry.torch_key] = _numpy_to_torch(entry.to_torch([flat[path] for path in entry.flax_paths]))
    return state_dict


def torch_to_flax_params(state_dict: Mapping[str, torch.Tensor], config: ModelConfig) -> dict:
    """A `TorchTransformer(config)` state_dict -> the Flax params tree (the content of variables['params']).

    Arrays are jax arrays with the torch dtypes. Raises ConversionError naming every missing or unexpected
    key, or the first one with a wrong shape.
    """
    import jax.numpy as jnp

    entries = parameter_map(config)
    _check_names("torch", set(state_dict), {entry.torch_key for entry in entries})
    flat = {}
    for entry in entries:
        tensor = state_dict[entry.torch_key]
        _check_shape("torch", entry.torch_key, tuple(tensor.shape), entry.torch_shape, ", ".join(entry.flax_paths))
        for path, array in zip(entry.flax_paths, entry.to_flax(_torch_to_numpy(tensor))):
            flat[tuple(path.split("/"))] = jnp.asarray(np.ascontiguousarray(array))
    return traverse_util.unflatten_dict(flat)


def export_torch_state_dict(params: Any, config: ModelConfig, path: str | os.PathLike) -> None:
    """Writes `flax_to_torch_state_dict(params, config)` with torch.save: a plain state_dict, loadable by
    `TorchTransformer(config).load_state_dict(torch.load(path, weights_only=True))`."""
    state_dict = flax_to_torch_state_dict(params, config)
    directory = os.path.dirname(os.fspath(path))
    if directory:
        os.makedirs(directory, exist_ok=True)
    torch.save(state_dict, path)


def import_torch_state_dict(path: str | os.PathLike, config: ModelConfig) -> dict:
    """Reads a state_dict written by torch.save (weights_only=True: no code runs) -> Flax params tree.

    Accepts a bare state_dict or a dict holding one under 'state_dict' (a common training checkpoint).
    """
    check_convertible(config)
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as error:  # noqa: BLE001 - unpickling errors come in several types
        raise ConversionError(
            f"{os.fspath(path)} is not a state_dict file written by torch.save ({type(error).__name__}); "
            f"write one with torch.save(model.state_dict(), path). Only plain tensors are read (no code runs)."
        ) from None
    if isinstance(loaded, Mapping) and "state_dict" in loaded and isinstance(loaded["state_dict"], Mapping):
        loaded = loaded["state_dict"]
    if not isinstance(loaded, Mapping):
        raise ConversionError(f"{os.fspath(path)} holds a {type(loaded).__name__}, not a state_dict.")
    return torch_to_flax_params(loaded, config)
