"""import-hf: a MarianMTModel made by transformers gives our model the same logits and greedy outputs, offline."""

import copy
import json
import shutil

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import sentencepiece as spm  # noqa: E402

from transformer_jax import cli  # noqa: E402
from transformer_jax import workdir as ckpt  # noqa: E402
from transformer_jax.data.builtin_corpus import generate_corpus  # noqa: E402
from transformer_jax.decoding import DecodeConfig, beam_search, greedy_decode  # noqa: E402
from transformer_jax.model import Transformer  # noqa: E402

SENTENCES = 6
EXTRA_LENGTH = 12
TOLERANCE = 1e-5
CONFIGS = {  # name -> MarianConfig fields beside the sizes
    "swish-tied": dict(activation_function="swish", tie_word_embeddings=True),
    "relu-untied": dict(activation_function="relu", tie_word_embeddings=False),
    "gelu-tied": dict(activation_function="gelu", tie_word_embeddings=True),
    "relu-separate-embeddings": dict(
        activation_function="relu", tie_word_embeddings=False, share_encoder_decoder_embeddings=False
    ),
}


def _train_spm(sentences, path, vocab_size):
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_prefix=str(path), vocab_size=vocab_size, minloglevel=2
    )
    (path.parent / f"{path.name}.model").rename(path)


@pytest.fixture(scope="module")
def pairs():
    return generate_corpus(seed=3, split_sizes={"train": 400, "validation": SENTENCES, "test": 0})


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, pairs):
    """source.spm (English), target.spm (German) and one joint vocab.json, as MarianTokenizer saves them:
    </s> 0, <unk> 1, the pieces of both models, <pad> last."""
    directory = tmp_path_factory.mktemp("marian-tokenizer")
    _train_spm([source for source, _ in pairs["train"]], directory / "source.spm", 150)
    _train_spm([target for _, target in pairs["train"]], directory / "target.spm", 150)
    vocab = {"</s>": 0, "<unk>": 1}
    for name in ("source.spm", "target.spm"):
        processor = spm.SentencePieceProcessor(model_file=str(directory / name))
        for index in range(processor.get_piece_size()):
            if not processor.is_control(index) and not processor.is_unknown(index):
                vocab.setdefault(processor.id_to_piece(index), len(vocab))
    vocab["<pad>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    tokenizer = transformers.MarianTokenizer(
        str(directory / "source.spm"), str(directory / "target.spm"), str(directory / "vocab.json")
    )
    tokenizer.save_pretrained(directory)
    return directory


def _hf_model(tokenizer_dir, name):
    vocab_size = len(json.loads((tokenizer_dir / "vocab.json").read_text()))
    config = transformers.MarianConfig(
        vocab_size=vocab_size,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=vocab_size - 1,
        decoder_start_token_id=vocab_size - 1,
        eos_token_id=0,
        forced_eos_token_id=None,
        scale_embedding=True,
        init_std=0.1,
        **CONFIGS[name],
    )
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():  # every weight off its initial value (LayerNorms, biases) and a nonzero logits bias
        for name, parameter in model.named_parameters():
            if "embed_positions" not in name:  # the sinusoids: computed, not saved
                parameter.add_(0.05 * torch.randn_like(parameter))
        model.final_logits_bias.normal_(0.0, 0.5)
    return model


def _save(model, tokenizer_dir, model_dir):
    """What MarianMTModel.save_pretrained and MarianTokenizer.save_pretrained write."""
    model.save_pretrained(model_dir)
    for path in tokenizer_dir.iterdir():
        shutil.copy(path, model_dir / path.name)


@pytest.fixture(scope="module", params=list(CONFIGS))
def imported(request, tmp_path_factory, tokenizer_dir):
    """(name, HF model, HF tokenizer, our workdir) for each config of CONFIGS."""
    model_dir = tmp_path_factory.mktemp(f"hf-{request.param}")
    model = _hf_model(tokenizer_dir, request.param)
    _save(model, tokenizer_dir, model_dir)
    workdir = tmp_path_factory.mktemp(f"imported-{request.param}") / "run"
    assert cli.main(["import-hf", "--model", str(model_dir), "--workdir", str(workdir)]) == 0
    tokenizer = transformers.MarianTokenizer.from_pretrained(model_dir)
    return request.param, model, tokenizer, workdir


def _batches(hf_tokenizer, pairs):
    """HF's padded batch: input_ids, attention_mask and labels (which the model shifts behind its start token)."""
    sources, targets = [s for s, _ in pairs["validation"]], [t for _, t in pairs["validation"]]
    return hf_tokenizer(sources, text_target=targets, padding=True, return_tensors="pt")


def _our_logits(workdir, pairs, change=lambda cfg, params: (cfg, params)):
    """Our logits [batch, tgt_len, vocab], inputs and decoder inputs, tokenized by our tokenizer."""
    cfg, params, tokenizer = ckpt.load_model_for_inference(workdir)
    cfg, params = change(cfg, params)
    sources = [tokenizer.encode(s) + [cfg.eos_id] for s, _ in pairs["validation"]]
    targets = [tokenizer.encode_target(t) + [cfg.eos_id] for _, t in pairs["validation"]]
    inputs = np.full((len(sources), max(map(len, sources))), cfg.pad_id, np.int32)  # [batch, src_len]
    decoder_inputs = np.full((len(targets), max(map(len, targets))), cfg.pad_id, np.int32)  # [batch, tgt_len]
    for row, (source, target) in enumerate(zip(sources, targets)):
        inputs[row, : len(source)] = source
        decoder_inputs[row, 1 : len(target)] = target[:-1]  # position 0: the start token, pad
    model = Transformer(cfg.replace(dropout_rate=0.0))
    return np.asarray(model.apply({"params": params}, jnp.asarray(inputs), jnp.asarray(decoder_inputs))), inputs


def _hf_logits(model, batch):
    with torch.no_grad():
        return model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
        ).logits.numpy()


def _largest_difference(ours, theirs, labels, pad_id):
    real = labels != pad_id  # [batch, tgt_len]: the target positions, not padding
    return float(np.abs(ours - theirs)[real].max())


def test_our_tokenizer_gives_marians_ids(imported, pairs):
    _, _, hf_tokenizer, workdir = imported
    _, _, tokenizer = ckpt.load_model_for_inference(workdir)
    for source, target in pairs["validation"]:
        assert tokenizer.encode(source) + [tokenizer.eos_id] == hf_tokenizer(source)["input_ids"]
        assert tokenizer.encode_target(target) + [tokenizer.eos_id] == hf_tokenizer(text_target=target)["input_ids"]


def test_logits_equal_transformers_on_a_padded_batch(imported, pairs):
    name, model, hf_tokenizer, workdir = imported
    batch = _batches(hf_tokenizer, pairs)
    ours, inputs = _our_logits(workdir, pairs)
    np.testing.assert_array_equal(inputs, batch["input_ids"].numpy())
    assert (batch["attention_mask"] == 0).any(), "the batch must be padded"
    labels = batch["labels"].numpy()
    difference = _largest_difference(ours, _hf_logits(model, batch), labels, model.config.pad_token_id)
    print(f"{name}: largest logit difference {difference:.2e}")
    assert difference < TOLERANCE


def _without_bias(cfg, params):
    return cfg, {**params, "final_logits_bias": jnp.zeros_like(params["final_logits_bias"])}


@pytest.mark.parametrize(
    "break_it",
    [
        pytest.param(lambda cfg, params: (cfg.replace(sinusoid_layout="interleaved"), params), id="interleaved"),
        pytest.param(_without_bias, id="no-logits-bias"),
        pytest.param(lambda cfg, params: (cfg.replace(layer_norm_epsilon=1e-3), params), id="epsilon"),
        pytest.param(
            lambda cfg, params: (cfg.replace(activation="gelu" if cfg.activation == "swish" else "swish"), params),
            id="activation",
        ),
    ],
)
def test_a_wrong_mapping_fails_the_logits_test(imported, pairs, break_it):
    """The tolerance is tight enough to catch each mapping mistake above."""
    _, model, hf_tokenizer, workdir = imported
    batch = _batches(hf_tokenizer, pairs)
    ours, _ = _our_logits(workdir, pairs, break_it)
    labels = batch["labels"].numpy()
    assert _largest_difference(ours, _hf_logits(model, batch), labels, model.config.pad_token_id) > 100 * TOLERANCE


def test_greedy_outputs_equal_generate(imported, pairs):
    name, model, hf_tokenizer, workdir = imported
    cfg, params, _ = ckpt.load_model_for_inference(workdir)
    batch = _batches(hf_tokenizer, pairs)
    inputs = batch["input_ids"].numpy()
    tokens, lengths = greedy_decode(
        Transformer(cfg.replace(dropout_rate=0.0)), params, inputs, config=DecodeConfig(extra_length=EXTRA_LENGTH)
    )
    with torch.no_grad():
        generated = model.generate(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            num_beams=1,
            do_sample=False,
            max_new_tokens=int(np.max(lengths)),
            bad_words_ids=[[cfg.pad_id]],  # as OPUS-MT's generation config; our decoders never emit pad
        ).numpy()[:, 1:]  # without the start token
    agree = sum(list(tokens[row, : lengths[row]]) == list(generated[row, : lengths[row]]) for row in range(len(inputs)))
    print(f"{name}: greedy outputs agree on {agree}/{len(inputs)} sentences, {int(np.sum(lengths))} tokens")
    assert agree == len(inputs)
    assert len({tuple(row) for row in tokens.tolist()}) > 1, "the outputs must depend on the source"


def test_translate_runs_on_the_imported_workdir(imported, pairs, tmp_path, capsys):
    _, _, _, workdir = imported
    source = tmp_path / "source.txt"
    source.write_text("".join(f"{s}\n" for s, _ in pairs["validation"]))
    assert cli.main(["translate", "--workdir", str(workdir), "--greedy", "--input", str(source)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == SENTENCES


def _set(field, value):
    def edit(model_dir):
        config = json.loads((model_dir / "config.json").read_text())
        config[field] = value
        (model_dir / "config.json").write_text(json.dumps(config))

    return edit


@pytest.mark.parametrize(
    "edit, message",
    [
        (_set("normalize_before", True), "normalize_before=True: pre-LN Marian models"),
        (_set("static_position_embeddings", False), "static_position_embeddings=False: learned positions"),
        (_set("scale_embedding", False), "scale_embedding=False: the embeddings here are always scaled"),
        (_set("activation_function", "tanh"), "activation_function='tanh'"),
        (_set("decoder_ffn_dim", 128), "decoder_ffn_dim=128: it must equal encoder_ffn_dim=64"),
        (lambda model_dir: (model_dir / "source.spm").unlink(), "lacks source.spm"),
        (lambda model_dir: shutil.copy(model_dir / "vocab.json", model_dir / "target_vocab.json"), "target_vocab.json"),
    ],
)
def test_a_model_we_cannot_express_is_refused_and_nothing_written(tokenizer_dir, tmp_path, capsys, edit, message):
    model_dir = tmp_path / "model"
    _save(_hf_model(tokenizer_dir, "swish-tied"), tokenizer_dir, model_dir)
    edit(model_dir)
    target = tmp_path / "run"
    assert cli.main(["import-hf", "--model", str(model_dir), "--workdir", str(target)]) == 1
    err = capsys.readouterr().err
    assert message in err and "Nothing was written" in err and "Traceback" not in err
    assert not target.exists()


def _hf_beam_score(hf_model, input_ids, tokens: list[int], start_id: int) -> float:
    """transformers' own score of a hypothesis: sum log p(token) by teacher forcing, over |Y| ** 1.0."""
    decoder_inputs = torch.tensor([[start_id] + tokens[:-1]])  # [1, len(tokens)]
    log_probs = torch.log_softmax(hf_model(input_ids=input_ids, decoder_input_ids=decoder_inputs).logits[0], dim=-1)
    return float(log_probs[torch.arange(len(tokens)), torch.tensor(tokens)].sum()) / len(tokens)


def test_beam_search_with_the_hf_penalty_equals_generate(imported, pairs):
    """Beam 4, |Y| ** 1.0 (generate's default length_penalty), on a padded batch, against generate with
    early_stopping='never' (its exact stop) run on each sentence alone, so that both have the sentence's length
    limit. Both models' logits bias lifts EOS to about its mean gap to the best token on the references (three
    settings), so that some hypotheses end before their limit.

    The searches keep the same live beams; they differ in which hypotheses may end: generate lets one end only if its
    EOS extension is among the best num_beams of its 2 * num_beams candidates (top_num_beam_mask), beam_search among
    all 2 * beam. So beam_search's best is generate's (same tokens, same score), or a hypothesis generate never
    finished, which then scores higher than generate's best, and its score is the one transformers' own forward pass
    gives those tokens. Which of the two happens for a sentence turns on near-ties, which float rounding settles
    differently by CPU and version, so the test asserts that each sentence is one of the two, not how many are which."""
    name, model, hf_tokenizer, workdir = imported
    cfg, params, _ = ckpt.load_model_for_inference(workdir)
    logits, _ = _our_logits(workdir, pairs)  # [batch, tgt_len, vocab]
    gap = float(np.mean(logits.max(-1) - logits[..., cfg.eos_id]))
    inputs = _batches(hf_tokenizer, pairs)["input_ids"].numpy()  # [batch, src_len]
    config = DecodeConfig(beam_size=4, alpha=1.0, length_penalty="hf", extra_length=EXTRA_LENGTH)
    limits = [int(np.sum(row != cfg.pad_id)) + EXTRA_LENGTH for row in inputs]
    agree, better, lengths = 0, 0, []
    for bonus in (gap - 1.0, gap, gap + 1.0):
        lifted = {**params, "final_logits_bias": params["final_logits_bias"].at[cfg.eos_id].add(bonus)}
        sequences, scores = beam_search(Transformer(cfg.replace(dropout_rate=0.0)), lifted, inputs, config=config)
        hf_model = copy.deepcopy(model)
        with torch.no_grad():
            hf_model.final_logits_bias[0, cfg.eos_id] += bonus
            for row, (source, _) in enumerate(pairs["validation"]):
                input_ids = hf_tokenizer([source], return_tensors="pt")["input_ids"]  # [1, src_len]
                generated = hf_model.generate(
                    input_ids=input_ids,
                    num_beams=4,
                    length_penalty=1.0,
                    early_stopping="never",
                    do_sample=False,
                    max_new_tokens=limits[row],
                    bad_words_ids=[[cfg.pad_id]],
                    return_dict_in_generate=True,
                    output_scores=True,
                )
                theirs = generated.sequences[0, 1:].tolist()  # without the start token
                theirs = theirs[: theirs.index(cfg.eos_id) + 1] if cfg.eos_id in theirs else theirs
                ours = [int(t) for t in sequences[row, 0] if t != cfg.pad_id]
                if ours == theirs:
                    agree += 1
                    np.testing.assert_allclose(scores[row, 0], generated.sequences_scores[0], rtol=1e-4)
                else:
                    better += 1
                    assert scores[row, 0] > float(generated.sequences_scores[0]) + 1e-5, (row, ours, theirs)
                    rescored = _hf_beam_score(hf_model, input_ids, ours, cfg.pad_id)
                    np.testing.assert_allclose(scores[row, 0], rescored, rtol=1e-4)
                lengths.append((len(theirs), limits[row]))
    print(
        f"{name}: beam 4, hf penalty: the best hypothesis is generate's for {agree}/{len(lengths)} sentences, "
        f"scores higher for {better} (transformers' own score of it); (length, limit) {lengths}"
    )
    assert any(1 < length < limit for length, limit in lengths), "no hypothesis ends before its limit"
