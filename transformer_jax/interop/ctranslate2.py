"""Conversion of a trained model to a CTranslate2 model directory, for serving on CPUs and GPUs.

Needs the extra: `pip install 'transformer-jax[ctranslate2]'`. The spec is `ctranslate2.specs.TransformerSpec`:

  post-LN (pre_norm=False) or pre-LN (pre_norm=True, with our final_norm as each stack's layer_norm), ReLU,
  embeddings scaled by sqrt(d_model), layer_norm_epsilon from the ModelConfig;
  {encoder,decoder}.position_encodings.encodings <- our position table [max_len, d_model], copied (sinusoids in
                                                 either layout, or the learned table), since CTranslate2's
                                                 built-in sinusoids are other ones;
  encoder.embeddings[0], decoder.embeddings      <- embed/embedding [vocab, d_model] (or source_/target_embed)
  decoder.projection.weight                      <- embed/embedding (or output_projection/kernel^T) [vocab, d_model]
  *.self_attention.linear[0]                     <- [query; key; value] kernels, each [d, h, k] -> [h*k, d]
  decoder.layer[i].attention.linear[0], [1]      <- query; [key; value] (cross-attention)
  *.linear[-1]                                   <- out/kernel [h, k, d] -> [d, h*k]  (biases when attention_bias)
  *.ffn.linear_0, linear_1                       <- ffn/wi, ffn/wo (kernel^T, bias)
  *.self_attention/attention/ffn.layer_norm      <- *_norm (scale -> gamma, bias -> beta)
The shared vocabulary is the SentencePiece pieces in id order; the source gets EOS appended (add_source_eos),
decoding starts from the BOS piece. Weights are converted to float32 before the optional quantization.
Our decoders' rules at translate time: min_decoding_length=0, suppress_sequences=[["<pad>"]] (pad is never emitted).
Refused: d_k or d_v other than d_model / num_heads (`check_expressible`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from flax import traverse_util

from transformer_jax.config import ModelConfig
from transformer_jax.errors import UserError

try:
    from ctranslate2.specs import TransformerSpec, common_spec
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "CTranslate2 export needs the ctranslate2 package: pip install 'transformer-jax[ctranslate2]'."
    ) from error

__all__ = [
    "CTranslate2ExportError",
    "QUANTIZATIONS",
    "check_expressible",
    "check_output_dir",
    "build_spec",
    "export_ctranslate2",
]

# The weight types ModelSpec.optimize accepts (None: keep float32).
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")


class CTranslate2ExportError(UserError, ValueError):
    """The model, its tokenizer or the output directory cannot be exported as asked (named in the message)."""


def check_output_dir(output: str | os.PathLike, *, force: bool) -> None:
    """Refuses a path that is a file, or an existing non-empty directory unless `force` (then it is replaced)."""
    path = Path(output)
    if path.exists() and not path.is_dir():
        raise CTranslate2ExportError(f"--output {output} is a file; pass a directory for the CTranslate2 model.")
    if path.is_dir() and any(path.iterdir()) and not force:
        raise CTranslate2ExportError(
            f"--output {output} exists and is not empty; choose a new directory, or pass --force to replace it. "
            f"Nothing was written."
        )


def _float32(array: Any) -> np.ndarray:
    """A writable float32 copy (quantization rescales the weights in place)."""
    return np.array(array, dtype=np.float32, copy=True)


class _Params:
    """Flat float32 view of the params tree: self['encoder/layer_0/ffn/wi/kernel'] -> np.ndarray."""

    def __init__(self, params: Any):
        from flax.core import unfreeze
        from flax.linen import unbox

        tree = unfreeze(unbox(params))
        if set(tree) == {"params"}:
            tree = tree["params"]
        self.flat = {"/".join(path): value for path, value in traverse_util.flatten_dict(tree).items()}

    def __getitem__(self, path: str) -> np.ndarray:
        if path not in self.flat:
            raise CTranslate2ExportError(
                f"the parameters have no '{path}'; check that the ModelConfig matches the one they were made with."
            )
        return _float32(self.flat[path])


def _set_linear(spec, weight: np.ndarray, bias: np.ndarray | None) -> None:
    """weight [out, in] (torch layout), bias [out] or None."""
    spec.weight = np.ascontiguousarray(weight)
    if bias is not None:
        spec.bias = np.ascontiguousarray(bias)


def _set_norm(spec, params: _Params, prefix: str) -> None:
    spec.gamma, spec.beta = params[f"{prefix}/scale"], params[f"{prefix}/bias"]


def _set_attention(spec, params: _Params, cfg: ModelConfig, prefix: str, *, self_attention: bool) -> None:
    """Our query/key/value kernels [d, h, k] and out kernel [h, k, d] -> CTranslate2's fused linears."""
    d, hk = cfg.d_model, cfg.num_heads * cfg.head_dim

    def weight(name: str) -> np.ndarray:  # [h*k, d]
        return params[f"{prefix}/{name}/kernel"].reshape(d, hk).T

    def bias(name: str) -> np.ndarray | None:  # [h*k]
        return params[f"{prefix}/{name}/bias"].reshape(hk) if cfg.attention_bias else None

    def fused(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray | None]:
        biases = [bias(name) for name in names]
        return (
            np.concatenate([weight(name) for name in names]),
            None if biases[0] is None else np.concatenate(biases),  # type: ignore[arg-type]
        )

    groups = [("query", "key", "value")] if self_attention else [("query",), ("key", "value")]
    for linear, names in zip(spec.linear, groups):
        _set_linear(linear, *fused(names))
    out_bias = params[f"{prefix}/out/bias"] if cfg.attention_bias else None
    _set_linear(spec.linear[-1], params[f"{prefix}/out/kernel"].reshape(hk, d).T, out_bias)


def _set_ffn(spec, params: _Params, prefix: str) -> None:
    _set_linear(spec.linear_0, params[f"{prefix}/wi/kernel"].T, params[f"{prefix}/wi/bias"])
    _set_linear(spec.linear_1, params[f"{prefix}/wo/kernel"].T, params[f"{prefix}/wo/bias"])


def _position_table(params: _Params, cfg: ModelConfig, stack: str) -> np.ndarray:
    """[max_len, d_model]: the table our PositionalEncoding adds for `stack`."""
    if cfg.position_encoding == "learned":
        return params[f"{stack}/positions/position_embedding"]
    from transformer_jax.layers.embedding import sinusoidal_table

    return sinusoidal_table(cfg.max_len, cfg.d_model, cfg.sinusoid_layout)


def _check_vocabulary(pieces: list[str], cfg: ModelConfig) -> None:
    if len(pieces) != cfg.vocab_size:
        raise CTranslate2ExportError(
            f"the tokenizer has {len(pieces)} pieces but the model's vocab_size is {cfg.vocab_size}; CTranslate2 "
            f"needs one vocabulary token per embedding row. Export a workdir whose spm.model trained this model."
        )
    if len(set(pieces)) != len(pieces):
        raise CTranslate2ExportError(
            "the tokenizer has duplicate pieces; CTranslate2 looks tokens up by their piece, so each must be unique."
        )


def check_expressible(config: ModelConfig) -> None:
    """Raises CTranslate2ExportError for what TransformerSpec cannot hold: one per-head size for queries, keys
    and values, d_model / num_heads (its fused QKV splits evenly); none of ModelConfig.marian_options."""
    if not config.has_paper_head_sizes:
        raise CTranslate2ExportError(
            f"CTranslate2's TransformerSpec has d_k = d_v = d_model / num_heads, but this model has "
            f"ModelConfig.key_dim={config.key_dim} (d_k={config.d_k}) and value_dim={config.value_dim} "
            f"(d_v={config.d_v}) with d_model={config.d_model}, num_heads={config.num_heads}; only a model with "
            "key_dim and value_dim None (or d_model / num_heads) exports. Nothing was written."
        )
    if config.marian_options:
        raise CTranslate2ExportError(
            f"the export writes a ReLU FFN, no logits bias and a bos token of its own, but this model has "
            f"ModelConfig.{', '.join(config.marian_options)} (an imported Marian model). Nothing was written."
        )


def build_spec(params: Any, config: ModelConfig, pieces: list[str], unk_id: int) -> TransformerSpec:
    """The validated TransformerSpec of `params` (a Transformer(config) params tree) with the vocabulary `pieces`
    (the SentencePiece pieces in id order, one per embedding row; pieces[unk_id] is the unknown token)."""
    cfg = config
    check_expressible(cfg)
    _check_vocabulary(pieces, cfg)
    flat = _Params(params)
    spec = TransformerSpec.from_config(
        (cfg.num_encoder_layers, cfg.num_decoder_layers),
        cfg.num_heads,
        pre_norm=cfg.norm_position == "pre",
        activation=common_spec.Activation.RELU,
    )
    if cfg.share_embeddings:
        source = target = flat["embed/embedding"]  # [vocab, d_model]
        projection = source
    else:
        source, target = flat["source_embed/embedding"], flat["target_embed/embedding"]
        projection = flat["output_projection/kernel"].T  # [d_model, vocab] -> [vocab, d_model]
    spec.encoder.embeddings[0].weight = source
    spec.decoder.embeddings.weight = target
    spec.decoder.projection.weight = projection
    spec.encoder.scale_embeddings = spec.decoder.scale_embeddings = True  # times sqrt(d_model), as ours

    for stack, stack_spec, num_layers in (
        ("encoder", spec.encoder, cfg.num_encoder_layers),
        ("decoder", spec.decoder, cfg.num_decoder_layers),
    ):
        stack_spec.position_encodings.encodings = _position_table(flat, cfg, stack)
        if cfg.norm_position == "pre":
            _set_norm(stack_spec.layer_norm, flat, f"{stack}/final_norm")
        for index in range(num_layers):
            layer, prefix = stack_spec.layer[index], f"{stack}/layer_{index}"
            _set_attention(layer.self_attention, flat, cfg, f"{prefix}/self_attention", self_attention=True)
            _set_norm(layer.self_attention.layer_norm, flat, f"{prefix}/self_attention_norm")
            if stack == "decoder":
                _set_attention(layer.attention, flat, cfg, f"{prefix}/cross_attention", self_attention=False)
                _set_norm(layer.attention.layer_norm, flat, f"{prefix}/cross_attention_norm")
            _set_ffn(layer.ffn, flat, f"{prefix}/ffn")
            _set_norm(layer.ffn.layer_norm, flat, f"{prefix}/ffn_norm")

    spec.config.layer_norm_epsilon = cfg.layer_norm_epsilon
    spec.config.unk_token = pieces[unk_id]
    spec.config.bos_token = spec.config.decoder_start_token = pieces[cfg.bos_id]
    spec.config.eos_token = pieces[cfg.eos_id]
    spec.config.add_source_eos = True  # our encoder input is the pieces + EOS
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.validate()
    return spec


def export_ctranslate2(
    params: Any,
    config: ModelConfig,
    tokenizer,
    output: str | os.PathLike,
    *,
    quantization: str | None = None,
    force: bool = False,
) -> Path:
    """Writes the CTranslate2 model directory of (params, config, tokenizer) to `output` (model.bin,
    config.json, shared_vocabulary.json); `quantization` is one of QUANTIZATIONS or None (float32).

    Load it with `ctranslate2.Translator(output)` and translate SentencePiece pieces (no BOS/EOS: the EOS is
    appended). Raises CTranslate2ExportError before writing anything when the export cannot be done.
    """
    check_output_dir(output, force=force)
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise CTranslate2ExportError(f"quantization={quantization!r} is unknown; use one of {QUANTIZATIONS}.")
    processor = tokenizer.processor
    pieces = [processor.id_to_piece(index) for index in range(processor.get_piece_size())]
    spec = build_spec(params, config, pieces, processor.unk_id())
    spec.optimize(quantization=quantization)
    path = Path(output)
    if path.exists():
        shutil.rmtree(path)  # --force: replace the directory, as CTranslate2's own converters do
    path.mkdir(parents=True)
    spec.save(str(path))
    return path
