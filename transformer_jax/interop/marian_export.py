"""A workdir as a Hugging Face MarianMT model directory: `export_marian` (`transformer-jax export-hf`), which
`MarianMTModel.from_pretrained` and `MarianTokenizer.from_pretrained` load. Needs only safetensors.

The inverse of interop/marian.py's import, for imported and trained workdirs alike:
  - the tensors of model.safetensors are marian_params' mapping run backwards; a model without attention biases
    or a logits bias gets zeros there, which transformers' Marian always has;
  - our interleaved sinusoids (§3.5) are Marian's [sin | cos] halves with the d_model features reordered
    (halves column i is interleaved column 2i, column d/2 + i is 2i + 1). Every operation on the residual stream
    (embeddings, LayerNorm, the projections into and out of it) commutes with reordering its features, so the
    exported parameters carry that permutation on their d_model axes and the model computes the same logits;
  - the tokenizer: an imported model's source.spm, target.spm and vocab.json again; a trained run's one spm.model
    as both source.spm and target.spm, with a vocab.json of its pieces at their ids;
  - the special ids: pad, eos, and decoder_start_token_id = our bos_id.
What transformers' Marian cannot express is refused by field before anything is written: its LayerNorms have
torch's epsilon 1e-5 (MarianConfig has no epsilon field), pre-LN, learned positions, d_k or d_v other than
d_model / num_heads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from flax import traverse_util

from transformer_jax.config import ModelConfig
from transformer_jax.data import marian_tokenizer
from transformer_jax.errors import UserError
from transformer_jax.interop.marian import ACTIVATIONS, CONFIG, LAYER_NORM_EPSILON, STACK_SUBLAYERS, WEIGHTS

TOKENIZER_CONFIG = "tokenizer_config.json"


class MarianExportError(UserError, ValueError):
    """A workdir that transformers' MarianMTModel cannot hold exactly, or an --output that cannot be written."""


def check_exportable(cfg: ModelConfig) -> None:
    """MarianExportError naming the first ModelConfig field that transformers' Marian cannot express."""
    refusals = (  # (field, its value, whether refused, why)
        (
            "layer_norm_epsilon",
            cfg.layer_norm_epsilon,
            cfg.layer_norm_epsilon != LAYER_NORM_EPSILON,
            f"transformers' Marian LayerNorms use torch's {LAYER_NORM_EPSILON} and MarianConfig has no field to "
            f"change it; train with --config.model.layer_norm_epsilon={LAYER_NORM_EPSILON}",
        ),
        ("norm_position", cfg.norm_position, cfg.norm_position != "post", "transformers' Marian is post-LN"),
        (
            "position_encoding",
            cfg.position_encoding,
            cfg.position_encoding != "sinusoidal",
            "transformers' Marian computes sinusoids",
        ),
        (
            "key_dim, value_dim",
            (cfg.key_dim, cfg.value_dim),
            not cfg.has_paper_head_sizes,
            "transformers' Marian projects queries, keys and values to d_model / num_heads per head",
        ),
    )
    for field, value, refused, why in refusals:
        if refused:
            raise MarianExportError(f"ModelConfig.{field}={value!r} cannot be exported: {why}. Nothing was written.")


def check_output_dir(output: str | os.PathLike) -> None:
    """Refuses a file, or a directory that is not empty."""
    path = Path(output)
    if path.exists() and not (path.is_dir() and not any(path.iterdir())):
        raise MarianExportError(f"--output {output} exists; give a new or empty directory. Nothing was written.")


def hf_config(cfg: ModelConfig, shared_embeddings: bool) -> dict:
    """The config.json of a MarianMTModel holding `cfg` (check_exportable(cfg) first); `shared_embeddings`: one
    matrix embeds source and target (share_encoder_decoder_embeddings)."""
    activation = {ours: theirs for theirs, ours in ACTIVATIONS.items() if theirs != "silu"}[cfg.activation]
    return {
        "model_type": "marian",
        "architectures": ["MarianMTModel"],
        "vocab_size": cfg.vocab_size,
        "decoder_vocab_size": cfg.vocab_size,
        "d_model": cfg.d_model,
        "encoder_layers": cfg.num_encoder_layers,
        "decoder_layers": cfg.num_decoder_layers,
        "encoder_attention_heads": cfg.num_heads,
        "decoder_attention_heads": cfg.num_heads,
        "encoder_ffn_dim": cfg.d_ff,
        "decoder_ffn_dim": cfg.d_ff,
        "max_position_embeddings": cfg.max_len,
        "activation_function": activation,
        "dropout": cfg.dropout_rate,
        "attention_dropout": cfg.attention_dropout_rate,
        "activation_dropout": cfg.relu_dropout_rate,
        "scale_embedding": True,
        "static_position_embeddings": True,
        "normalize_before": False,
        "normalize_embedding": False,
        "share_encoder_decoder_embeddings": shared_embeddings,
        "tie_word_embeddings": cfg.share_embeddings,
        "pad_token_id": cfg.pad_id,
        "eos_token_id": cfg.eos_id,
        "forced_eos_token_id": cfg.eos_id,
        "decoder_start_token_id": cfg.bos_id,
        "bad_words_ids": [[cfg.pad_id]],  # as OPUS-MT's configs: our decoders never emit pad
        "is_encoder_decoder": True,
    }


def _halves_order(cfg: ModelConfig) -> np.ndarray:
    """The d_model features of our model in transformers' order: identity for 'halves', for 'interleaved' the
    sin features (even columns) then the cos features (odd columns)."""
    order = np.arange(cfg.d_model)
    return order if cfg.sinusoid_layout == "halves" else np.concatenate([order[0::2], order[1::2]])


def marian_tensors(params: Any, cfg: ModelConfig) -> tuple[dict[str, np.ndarray], bool]:
    """(model.safetensors tensors of `params`, whether the encoder and decoder embeddings are one matrix)."""
    from flax.core import unfreeze
    from flax.linen import unbox

    flat = {
        "/".join(path): np.asarray(leaf, np.float32)
        for path, leaf in traverse_util.flatten_dict(unfreeze(unbox(params))).items()
    }
    order = _halves_order(cfg)
    d, h, k = cfg.d_model, cfg.num_heads, cfg.head_dim

    def residual(array: np.ndarray, axis: int) -> np.ndarray:
        return np.ascontiguousarray(np.take(array, order, axis=axis))

    bias = flat.get("final_logits_bias", np.zeros(cfg.vocab_size, np.float32))
    tensors: dict[str, np.ndarray] = {"final_logits_bias": bias.reshape(1, cfg.vocab_size)}
    if cfg.share_embeddings:
        tensors["model.shared.weight"] = residual(flat["embed/embedding"], 1)
        shared = True
    else:  # transformers ties the embeddings only with tie_word_embeddings: each matrix is saved
        source, target = (residual(flat[f"{side}_embed/embedding"], 1) for side in ("source", "target"))
        shared = np.array_equal(source, target)
        if shared:
            tensors["model.shared.weight"] = source
        tensors["model.encoder.embed_tokens.weight"] = source
        tensors["model.decoder.embed_tokens.weight"] = target
        tensors["lm_head.weight"] = residual(flat["output_projection/kernel"], 0).T  # [d, vocab] -> [vocab, d]
    for stack, sublayers in STACK_SUBLAYERS.items():
        num_layers = cfg.num_encoder_layers if stack == "encoder" else cfg.num_decoder_layers
        for index in range(num_layers):
            ours, theirs = f"{stack}/layer_{index}", f"model.{stack}.layers.{index}"
            for sublayer, (attention, norm) in sublayers.items():
                tensors[f"{theirs}.{norm}.weight"] = residual(flat[f"{ours}/{sublayer}_norm/scale"], 0)
                tensors[f"{theirs}.{norm}.bias"] = residual(flat[f"{ours}/{sublayer}_norm/bias"], 0)
                if attention is None:
                    wi, wo = (f"{ours}/ffn/{name}" for name in ("wi", "wo"))
                    tensors[f"{theirs}.fc1.weight"] = residual(flat[f"{wi}/kernel"], 0).T  # [out, in]
                    tensors[f"{theirs}.fc1.bias"] = flat[f"{wi}/bias"]
                    tensors[f"{theirs}.fc2.weight"] = residual(flat[f"{wo}/kernel"], 1).T
                    tensors[f"{theirs}.fc2.bias"] = residual(flat[f"{wo}/bias"], 0)
                    continue
                for name, projection in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
                    kernel = residual(flat[f"{ours}/{sublayer}/{name}/kernel"], 0)  # [d, h, k]
                    tensors[f"{theirs}.{attention}.{projection}.weight"] = kernel.reshape(d, h * k).T  # [h*k, d]
                    projection_bias = flat.get(f"{ours}/{sublayer}/{name}/bias", np.zeros((h, k), np.float32))
                    tensors[f"{theirs}.{attention}.{projection}.bias"] = projection_bias.reshape(h * k)
                out = residual(flat[f"{ours}/{sublayer}/out/kernel"], 2)  # [h, k, d]
                tensors[f"{theirs}.{attention}.out_proj.weight"] = out.reshape(h * k, d).T  # [d, h*k]
                out_bias = flat.get(f"{ours}/{sublayer}/out/bias", np.zeros(d, np.float32))
                tensors[f"{theirs}.{attention}.out_proj.bias"] = residual(out_bias, 0)
    return {name: np.ascontiguousarray(array) for name, array in tensors.items()}, shared


def _tokenizer_files(tokenizer: Any, cfg: ModelConfig) -> dict[str, bytes]:
    """source.spm, target.spm and vocab.json of our tokenizer: Marian's own, or the one spm.model twice."""
    if isinstance(tokenizer, marian_tokenizer.MarianTokenizer):
        source, target, vocab = tokenizer.source, tokenizer.target, tokenizer.vocab
    else:
        source = target = tokenizer.processor
        vocab = {source.id_to_piece(index): index for index in range(source.get_piece_size())}
        special = {
            "pad": (marian_tokenizer.PAD, cfg.pad_id),
            "eos": (marian_tokenizer.EOS, cfg.eos_id),
            "unk": (marian_tokenizer.UNK, tokenizer.unk_id),
        }
        for name, (piece, index) in special.items():
            if vocab.get(piece) != index:
                raise MarianExportError(
                    f"spm.model's {name} id {index} is not the piece {piece!r}, which MarianTokenizer needs. Nothing "
                    "was written."
                )
    return {
        marian_tokenizer.SOURCE_SPM: source.serialized_model_proto(),
        marian_tokenizer.TARGET_SPM: target.serialized_model_proto(),
        marian_tokenizer.VOCAB: json.dumps(vocab, ensure_ascii=False, indent=2).encode("utf-8"),
    }


def export_marian(
    params: Any, cfg: ModelConfig, tokenizer: Any, output: str | os.PathLike, *, languages: dict[str, str]
) -> None:
    """Writes config.json, model.safetensors, the tokenizer files and tokenizer_config.json (`languages`:
    source_lang, target_lang) into the new or empty directory `output`; everything is checked first."""
    from safetensors.numpy import save_file

    check_output_dir(output)
    check_exportable(cfg)
    files = _tokenizer_files(tokenizer, cfg)
    tensors, shared = marian_tensors(params, cfg)
    tokenizer_config = {
        "tokenizer_class": "MarianTokenizer",
        "separate_vocabs": False,
        "model_max_length": cfg.max_len,
        **languages,
    }
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (output / name).write_bytes(content)
    (output / TOKENIZER_CONFIG).write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    (output / CONFIG).write_text(json.dumps(hf_config(cfg, shared), indent=2) + "\n")
    save_file(tensors, str(output / WEIGHTS), metadata={"format": "pt"})
