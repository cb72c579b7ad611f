"""Hugging Face MarianMT (OPUS-MT) models as workdirs: `import_marian(model_dir, workdir)` (`transformer-jax
import-hf`). Needs only safetensors, not torch or transformers.

A MarianMTModel is the 2017 Transformer: post-LN, sinusoids in the [sin | cos] halves layout from position 0
(computed, not stored), embeddings times sqrt(d_model). Its other choices become ModelConfig options:
activation_function -> activation, final_logits_bias, torch's LayerNorm epsilon 1e-5, biased attention
projections, the decoder starting from pad (bos_id = pad_id), tie_word_embeddings -> share_embeddings. A config
field with no ModelConfig counterpart is refused by name before anything is written.

Parameters (model_dir/model.safetensors -> Flax paths):
  model.shared.weight [vocab, d]                 -> embed/embedding (tied), or source_embed and target_embed
    (model.encoder / model.decoder .embed_tokens.weight where saved), lm_head.weight -> output_projection/kernel^T
  final_logits_bias [1, vocab]                   -> final_logits_bias [vocab]
  model.{stack}.layers.i.{self_attn,encoder_attn}.{q,k,v}_proj.weight [h*k, d]
                                                 -> {stack}/layer_i/{self,cross}_attention/{query,key,value}/kernel
                                                    [d, h, k] (bias [h*k] -> [h, k])
  ...out_proj.weight [d, h*k]                    -> .../out/kernel [h, k, d] (bias [d])
  ...fc1.weight, fc2.weight [out, in]            -> ffn/wi, ffn/wo kernel [in, out]
  ...self_attn_layer_norm, encoder_attn_layer_norm, final_layer_norm
                                                 -> self_attention_norm, cross_attention_norm, ffn_norm
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from flax import traverse_util

from transformer_jax.config import ModelConfig
from transformer_jax.data import marian_tokenizer
from transformer_jax.errors import UserError

CONFIG, WEIGHTS = "config.json", "model.safetensors"
REQUIRED_FILES = (CONFIG, WEIGHTS, *marian_tokenizer.FILENAMES)
REQUIRED_FIELDS = (
    "vocab_size",
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "max_position_embeddings",
    "activation_function",
    "pad_token_id",
    "eos_token_id",
)
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}  # transformers' name -> ours
LAYER_NORM_EPSILON = 1e-5  # torch.nn.LayerNorm's default, which Marian keeps
STACK_SUBLAYERS = {  # Flax sublayer -> (Marian attention, Marian LayerNorm); None: the FFN
    "encoder": {"self_attention": ("self_attn", "self_attn_layer_norm"), "ffn": (None, "final_layer_norm")},
    "decoder": {
        "self_attention": ("self_attn", "self_attn_layer_norm"),
        "cross_attention": ("encoder_attn", "encoder_attn_layer_norm"),
        "ffn": (None, "final_layer_norm"),
    },
}


class MarianImportError(UserError, ValueError):
    """A Hugging Face model directory this package cannot import; the message names the file or field."""


def _refuse(field: str, value: Any, why: str) -> MarianImportError:
    return MarianImportError(f"{CONFIG}: {field}={value!r}: {why}. Nothing was written.")


def model_config_from_hf(hf: dict) -> ModelConfig:
    """The ModelConfig of a MarianConfig's config.json; MarianImportError names the first field it cannot express."""
    if hf.get("model_type") != "marian":
        raise _refuse("model_type", hf.get("model_type"), "only MarianMT models (model_type 'marian') import")
    missing = [field for field in REQUIRED_FIELDS if field not in hf]
    if missing:
        raise MarianImportError(f"{CONFIG} lacks {', '.join(missing)}. Nothing was written.")
    unsupported = (  # (field, the value refused, its default in transformers, why)
        ("normalize_before", True, False, "pre-LN Marian models (LayerNorm before each sub-layer) are not supported"),
        ("normalize_embedding", True, False, "a LayerNorm on the embeddings has no counterpart here"),
        ("static_position_embeddings", False, True, "learned positions are not supported, only the sinusoids"),
        ("scale_embedding", False, False, "the embeddings here are always scaled by sqrt(d_model)"),
    )
    for field, refused, default, why in unsupported:
        if hf.get(field, default) == refused:
            raise _refuse(field, refused, why)
    if hf["activation_function"] not in ACTIVATIONS:
        raise _refuse("activation_function", hf["activation_function"], f"use one of {sorted(ACTIVATIONS)}")
    for encoder_field, decoder_field in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ):
        if hf[encoder_field] != hf[decoder_field]:
            raise _refuse(decoder_field, hf[decoder_field], f"it must equal {encoder_field}={hf[encoder_field]}")
    shared = hf.get("share_encoder_decoder_embeddings", True)
    if not shared and hf.get("decoder_vocab_size") not in (None, hf["vocab_size"]):
        raise _refuse("decoder_vocab_size", hf["decoder_vocab_size"], "a target vocabulary of its own is not supported")
    for field in ("eos_token_id", "pad_token_id"):
        if not isinstance(hf[field], int):
            raise _refuse(field, hf[field], "one id is needed")
    if hf.get("decoder_start_token_id", hf["pad_token_id"]) != hf["pad_token_id"]:
        raise _refuse(
            "decoder_start_token_id", hf["decoder_start_token_id"], f"it must be pad_token_id={hf['pad_token_id']}"
        )
    try:
        return ModelConfig(
            vocab_size=hf["vocab_size"],
            d_model=hf["d_model"],
            num_heads=hf["encoder_attention_heads"],
            d_ff=hf["encoder_ffn_dim"],
            num_encoder_layers=hf["encoder_layers"],
            num_decoder_layers=hf["decoder_layers"],
            dropout_rate=hf.get("dropout", 0.1),
            attention_dropout_rate=hf.get("attention_dropout", 0.0),
            relu_dropout_rate=hf.get("activation_dropout", 0.0),
            activation=ACTIVATIONS[hf["activation_function"]],
            sinusoid_layout="halves",
            max_len=hf["max_position_embeddings"],
            share_embeddings=shared and hf.get("tie_word_embeddings", True),
            final_logits_bias=True,
            attention_bias=True,
            layer_norm_epsilon=LAYER_NORM_EPSILON,
            pad_id=hf["pad_token_id"],
            bos_id=hf["pad_token_id"],
            eos_id=hf["eos_token_id"],
        )
    except ValueError as error:
        raise MarianImportError(
            f"{CONFIG} describes no model this package holds: {error}. Nothing was written."
        ) from None


def marian_params(tensors: dict[str, np.ndarray], cfg: ModelConfig) -> dict:
    """The Flax params tree of `Transformer(cfg)` from a MarianMTModel's safetensors `tensors`."""
    d, h, k = cfg.d_model, cfg.num_heads, cfg.head_dim
    used: set[str] = set()

    def take(key: str) -> np.ndarray:
        if key not in tensors:
            raise MarianImportError(f"{WEIGHTS} has no tensor {key!r}, which {CONFIG} implies. Nothing was written.")
        used.add(key)
        return np.asarray(tensors[key], np.float32)

    def first(*keys: str) -> np.ndarray:
        return take(next((key for key in keys if key in tensors), keys[-1]))

    flat: dict[str, np.ndarray] = {"final_logits_bias": take("final_logits_bias").reshape(cfg.vocab_size)}
    shared = "model.shared.weight"
    if cfg.share_embeddings:
        flat["embed/embedding"] = take(shared)
    else:
        flat["source_embed/embedding"] = first("model.encoder.embed_tokens.weight", shared)
        flat["target_embed/embedding"] = first("model.decoder.embed_tokens.weight", shared)
        flat["output_projection/kernel"] = take("lm_head.weight").T  # [vocab, d] -> [d, vocab]
    for stack, sublayers in STACK_SUBLAYERS.items():
        num_layers = cfg.num_encoder_layers if stack == "encoder" else cfg.num_decoder_layers
        for index in range(num_layers):
            ours, theirs = f"{stack}/layer_{index}", f"model.{stack}.layers.{index}"
            for sublayer, (attention, norm) in sublayers.items():
                flat[f"{ours}/{sublayer}_norm/scale"] = take(f"{theirs}.{norm}.weight")
                flat[f"{ours}/{sublayer}_norm/bias"] = take(f"{theirs}.{norm}.bias")
                if attention is None:
                    for name, linear in (("wi", "fc1"), ("wo", "fc2")):
                        flat[f"{ours}/ffn/{name}/kernel"] = take(f"{theirs}.{linear}.weight").T  # [in, out]
                        flat[f"{ours}/ffn/{name}/bias"] = take(f"{theirs}.{linear}.bias")
                    continue
                for name, projection in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
                    weight = take(f"{theirs}.{attention}.{projection}.weight")  # [h*k, d]
                    flat[f"{ours}/{sublayer}/{name}/kernel"] = weight.T.reshape(d, h, k)
                    flat[f"{ours}/{sublayer}/{name}/bias"] = take(f"{theirs}.{attention}.{projection}.bias").reshape(
                        h, k
                    )
                out = take(f"{theirs}.{attention}.out_proj.weight")  # [d, h*k]
                flat[f"{ours}/{sublayer}/out/kernel"] = out.T.reshape(h, k, d)
                flat[f"{ours}/{sublayer}/out/bias"] = take(f"{theirs}.{attention}.out_proj.bias")
    # transformers computes the sinusoids, and ties the copies of model.shared.weight to it on loading
    tied = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight", shared)
    ignored = {key for key in tensors if ".embed_positions." in key} | set(tied if cfg.share_embeddings else [shared])
    unexpected = sorted(set(tensors) - used - ignored)
    if unexpected:
        raise MarianImportError(
            f"{WEIGHTS} holds tensors with no place in the model {CONFIG} describes: {', '.join(unexpected)}. "
            "Nothing was written."
        )
    _check_shapes(flat, cfg)
    return traverse_util.unflatten_dict({tuple(path.split("/")): array for path, array in flat.items()})


def _check_shapes(flat: dict[str, np.ndarray], cfg: ModelConfig) -> None:
    """Every parameter of Transformer(cfg) is there with its shape (a checkpoint that does not fit its config)."""
    import jax
    import jax.numpy as jnp
    from flax.linen import unbox

    from transformer_jax.model import Transformer

    tokens = jnp.zeros((1, 1), jnp.int32)  # [batch, length]
    abstract = jax.eval_shape(lambda: unbox(Transformer(cfg).init(jax.random.key(0), tokens, tokens))["params"])
    expected = {"/".join(path): leaf.shape for path, leaf in traverse_util.flatten_dict(abstract).items()}
    got = {path: array.shape for path, array in flat.items()}
    if got != expected:
        wrong = sorted(
            f"{path}: {got.get(path)} (expected {shape})" for path, shape in expected.items() if got.get(path) != shape
        )
        raise MarianImportError(f"{WEIGHTS} does not fit {CONFIG}: {'; '.join(wrong)}. Nothing was written.")


def _tokenizer_config(model_dir: Path) -> dict:
    """MarianTokenizer's tokenizer_config.json (separate_vocabs, source_lang, target_lang), {} if absent."""
    path = model_dir / "tokenizer_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _check_tokenizer(model_dir: Path, cfg: ModelConfig) -> None:
    """One joint vocabulary whose pad and eos are the model's, and whose ids fit its embeddings."""
    if _tokenizer_config(model_dir).get("separate_vocabs", False) or (model_dir / "target_vocab.json").is_file():
        raise MarianImportError(
            f"{model_dir} has a target vocabulary of its own (target_vocab.json, separate_vocabs); only one joint "
            f"{marian_tokenizer.VOCAB} is supported. Nothing was written."
        )
    try:
        tokenizer = marian_tokenizer.MarianTokenizer.from_directory(model_dir)
    except (OSError, RuntimeError, ValueError) as error:
        raise MarianImportError(f"{model_dir}: the tokenizer cannot be read ({error}). Nothing was written.") from None
    ids = {"pad": (tokenizer.pad_id, cfg.pad_id), "eos": (tokenizer.eos_id, cfg.eos_id)}
    for name, (theirs, ours) in ids.items():
        if theirs != ours:
            raise MarianImportError(
                f"{marian_tokenizer.VOCAB} has {name} id {theirs} but {CONFIG} {name}_token_id={ours}. Nothing was "
                "written."
            )
    if max(tokenizer.vocab.values()) >= cfg.vocab_size:
        raise MarianImportError(
            f"{marian_tokenizer.VOCAB} has ids up to {max(tokenizer.vocab.values())}, beyond {CONFIG} "
            f"vocab_size={cfg.vocab_size}. Nothing was written."
        )


def _check_model_dir(model_dir: Path) -> None:
    missing = [name for name in REQUIRED_FILES if not (model_dir / name).is_file()]
    if not missing:
        return
    hint = ""
    if WEIGHTS in missing and (model_dir / "pytorch_model.bin").is_file():
        hint = (
            " It has pytorch_model.bin: load it with transformers' MarianMTModel.from_pretrained and "
            f"save_pretrained it again to write {WEIGHTS}."
        )
    raise MarianImportError(
        f"{model_dir} lacks {', '.join(missing)}: give the directory MarianMTModel.save_pretrained and "
        f"MarianTokenizer.save_pretrained write.{hint} Nothing was written."
    )


def _check_new_workdir(workdir: Path) -> None:
    from transformer_jax.workdir import CONFIG_FILENAME, check_workdir

    check_workdir(workdir)
    if (workdir / CONFIG_FILENAME).exists() or (workdir / "imported").exists():
        raise MarianImportError(
            f"--workdir {workdir} already holds a model; give a new or empty one. Nothing was written."
        )


def import_marian(model_dir: str | Path, workdir: str | Path) -> ModelConfig:
    """Writes the MarianMTModel in `model_dir` as a workdir: config.json (the model and data sections),
    the tokenizer files and the parameters as imported/. Everything is checked before anything is written."""
    from safetensors.numpy import load_file

    from transformer_jax.experiment import DataConfig, Experiment
    from transformer_jax.workdir import save_config, save_named_params

    model_dir, workdir = Path(model_dir), Path(workdir)
    _check_new_workdir(workdir)
    _check_model_dir(model_dir)
    hf = json.loads((model_dir / CONFIG).read_text())
    cfg = model_config_from_hf(hf)
    _check_tokenizer(model_dir, cfg)
    params = marian_params(load_file(model_dir / WEIGHTS), cfg)
    languages = _tokenizer_config(model_dir)
    data = DataConfig(
        vocab_size=cfg.vocab_size,
        max_len=min(DataConfig.max_len, cfg.max_len),
        **{key: languages[key] for key in ("source_lang", "target_lang") if languages.get(key)},
    )
    workdir.mkdir(parents=True, exist_ok=True)
    for name in marian_tokenizer.FILENAMES:
        shutil.copyfile(model_dir / name, workdir / name)
    save_config(workdir, Experiment(model=cfg, data=data).to_dict())
    save_named_params(workdir, "imported", params, steps=[])
    return cfg
