"""export-hf: an imported or a trained workdir written as a MarianMT directory that transformers loads and runs with
our logits."""

import json
import shutil

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import test_hf_marian  # noqa: E402
from conftest import tiny_run_overrides  # noqa: E402

from transformer_jax import cli  # noqa: E402
from transformer_jax import workdir as ckpt  # noqa: E402
from transformer_jax.data.builtin_corpus import generate_corpus  # noqa: E402
from transformer_jax.experiment import load_experiment  # noqa: E402
from transformer_jax.model import Transformer  # noqa: E402
from transformer_jax.train import loop  # noqa: E402

TOLERANCE = test_hf_marian.TOLERANCE
# the imported workdirs of test_hf_marian: one per MarianConfig there
pairs, tokenizer_dir, imported = test_hf_marian.pairs, test_hf_marian.tokenizer_dir, test_hf_marian.imported
ROUND_TRIP_FIELDS = (  # MarianConfig fields an import then export gives back
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
    "tie_word_embeddings",
    "scale_embedding",
    "pad_token_id",
    "eos_token_id",
    "decoder_start_token_id",
)


def _export(workdir, output):
    return cli.main(["export-hf", "--workdir", str(workdir), "--output", str(output)])


def _load(output):
    model, info = transformers.MarianMTModel.from_pretrained(output, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    return model.eval(), transformers.MarianTokenizer.from_pretrained(output)


def _compare_logits(workdir, model, hf_tokenizer, sentence_pairs):
    """The largest |our logit - transformers' logit| over the real target positions of a padded batch, which
    both tokenizers must encode alike."""
    cfg, params, tokenizer = ckpt.load_model_for_inference(workdir)
    sources, targets = [s for s, _ in sentence_pairs], [t for _, t in sentence_pairs]
    batch = hf_tokenizer(sources, text_target=targets, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any(), "the batch must be padded"
    labels = batch["labels"].numpy()  # [batch, tgt_len]: target + eos, padded
    ids = [tokenizer.encode_target(t) + [cfg.eos_id] for t in targets]
    assert all(list(labels[row, : len(target)]) == target for row, target in enumerate(ids))
    decoder_inputs = np.full(labels.shape, cfg.pad_id, np.int32)  # [batch, tgt_len]
    decoder_inputs[:, 0] = cfg.bos_id
    for row, target in enumerate(ids):
        decoder_inputs[row, 1 : len(target)] = target[:-1]
    inputs = batch["input_ids"].numpy()  # [batch, src_len]
    assert [list(row[row != cfg.pad_id]) for row in inputs] == [tokenizer.encode(s) + [cfg.eos_id] for s in sources]
    ours = Transformer(cfg.replace(dropout_rate=0.0)).apply(
        {"params": params}, jnp.asarray(inputs), jnp.asarray(decoder_inputs)
    )
    with torch.no_grad():
        theirs = model(**batch).logits.numpy()
    return float(np.abs(np.asarray(ours) - theirs)[labels != cfg.pad_id].max())


def test_an_imported_model_round_trips(imported, pairs, tmp_path):
    name, original, _, workdir = imported
    output = tmp_path / "exported"
    assert _export(workdir, output) == 0
    model, hf_tokenizer = _load(output)
    for field in ROUND_TRIP_FIELDS:
        assert getattr(model.config, field) == getattr(original.config, field), field
    embeddings = original.model.encoder.embed_tokens.weight, original.model.decoder.embed_tokens.weight
    # transformers ties the embeddings only with tie_word_embeddings: otherwise they are one matrix if equal
    assert model.config.share_encoder_decoder_embeddings == bool(torch.equal(*embeddings))
    for file in ("source.spm", "target.spm"):
        assert (output / file).read_bytes() == (workdir / file).read_bytes()
    assert json.loads((output / "vocab.json").read_text()) == json.loads((workdir / "vocab.json").read_text())
    difference = _compare_logits(workdir, model, hf_tokenizer, pairs["validation"])
    print(f"{name}: export-hf of the import, largest logit difference {difference:.2e}")
    assert difference < TOLERANCE


@pytest.fixture(scope="module", params=["halves", "interleaved"])
def trained(request, tmp_path_factory):
    """A workdir trained here (one spm.model, bos 1 != pad 0, no biases) with torch's LayerNorm epsilon."""
    directory = tmp_path_factory.mktemp(f"trained-{request.param}")
    overrides = tiny_run_overrides(
        steps=3, **{"model.sinusoid_layout": request.param, "model.layer_norm_epsilon": 1e-5}
    )
    loop.train(load_experiment("experiments/tiny.py", overrides), directory)
    return request.param, directory


def test_a_trained_workdir_exports_with_our_logits(trained, tmp_path):
    layout, workdir = trained
    output = tmp_path / "exported"
    assert _export(workdir, output) == 0
    model, hf_tokenizer = _load(output)
    cfg = ckpt.model_config_from_workdir(workdir)
    assert (model.config.decoder_start_token_id, model.config.pad_token_id) == (cfg.bos_id, cfg.pad_id)
    sentence_pairs = generate_corpus(seed=5, split_sizes={"train": 0, "validation": 6, "test": 0})["validation"]
    difference = _compare_logits(workdir, model, hf_tokenizer, sentence_pairs)
    print(f"trained, {layout} sinusoids: largest logit difference {difference:.2e}")
    assert difference < TOLERANCE


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("layer_norm_epsilon", 1e-6, "ModelConfig.layer_norm_epsilon=1e-06 cannot be exported"),
        ("norm_position", "pre", "ModelConfig.norm_position='pre' cannot be exported"),
        ("position_encoding", "learned", "ModelConfig.position_encoding='learned' cannot be exported"),
    ],
)
def test_what_marian_cannot_hold_is_refused_and_nothing_written(trained, tmp_path, capsys, field, value, message):
    _, workdir = trained
    copy = tmp_path / "run"
    shutil.copytree(workdir, copy)
    config = json.loads((copy / "config.json").read_text())
    config["model"][field] = value
    (copy / "config.json").write_text(json.dumps(config))
    output = tmp_path / "exported"
    assert _export(copy, output) == 1
    err = capsys.readouterr().err
    assert message in err and "Nothing was written" in err and "Traceback" not in err
    assert not output.exists()


def test_a_non_empty_output_is_refused(trained, tmp_path, capsys):
    _, workdir = trained
    (tmp_path / "kept.txt").write_text("mine")
    assert _export(workdir, tmp_path) == 1
    assert "give a new or empty directory" in capsys.readouterr().err
    assert [path.name for path in tmp_path.iterdir()] == ["kept.txt"]
