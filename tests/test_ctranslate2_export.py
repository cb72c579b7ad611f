"""export-ctranslate2: CTranslate2 decodes an exported model to the same tokens as our decoders."""

import pytest

ctranslate2 = pytest.importorskip("ctranslate2")

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from conftest import tiny_run_overrides  # noqa: E402
from flax import traverse_util  # noqa: E402

from transformer_jax import cli  # noqa: E402
from transformer_jax import workdir as ckpt  # noqa: E402
from transformer_jax.data.sources import source_from_config  # noqa: E402
from transformer_jax.decoding import DecodeConfig, beam_search, greedy_decode  # noqa: E402
from transformer_jax.decoding.config import length_penalty  # noqa: E402
from transformer_jax.experiment import Experiment, load_experiment  # noqa: E402
from transformer_jax.interop import ctranslate2 as export  # noqa: E402
from transformer_jax.model import Transformer  # noqa: E402

SENTENCES = 20
DECODE = DecodeConfig()  # beam 4, alpha 0.6, limit = source length + 50 within max_len


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(workdir, exported model directory): 150 updates, enough for outputs that depend on the source."""
    directory = tmp_path_factory.mktemp("trained")
    overrides = {"optimizer.warmup_steps": 60, "train.eval_every": 150, "train.checkpoint_every": 150}
    from transformer_jax.train import loop

    loop.train(load_experiment("experiments/tiny.py", tiny_run_overrides(steps=150, **overrides)), directory)
    output = tmp_path_factory.mktemp("exported") / "ct2"
    assert cli.main(["export-ctranslate2", "--workdir", str(directory), "--output", str(output)]) == 0
    return directory, output


@pytest.fixture(scope="module")
def sources(trained):
    """Token ids (pieces + EOS) of the first validation sentences."""
    directory, _ = trained
    _, _, tokenizer = ckpt.load_model_for_inference(directory)
    data = Experiment.from_dict(ckpt.load_config(directory)).data
    pairs = list(source_from_config(data, splits=("validation",)).pairs("validation"))[:SENTENCES]
    return [tokenizer.encode(source) + [tokenizer.eos_id] for source, _ in pairs]


def ct2_translate(translator, tokenizer, ids, max_len, **options):
    """CTranslate2's hypotheses as id lists (EOS kept) and scores, under our length limit and pad rule."""
    pieces = [tokenizer.processor.id_to_piece(i) for i in ids[:-1]]  # the EOS is appended by the model
    result = translator.translate_batch(
        [pieces],
        max_decoding_length=min(len(ids) + DECODE.extra_length, max_len),
        min_decoding_length=0,
        return_end_token=True,
        suppress_sequences=[[tokenizer.processor.id_to_piece(0)]],  # our decoders never emit pad (id 0)
        return_scores=True,
        **options,
    )[0]
    hypotheses = [[tokenizer.processor.piece_to_id(piece) for piece in h] for h in result.hypotheses]
    return hypotheses, list(result.scores)


def padded_batch(sources, pad_id):
    """[len(sources), longest] int32: the sources as one batch (one compile, where a batch per sentence would
    compile once per source length); each sentence's length limit is its own (decoding.per_sentence_limits)."""
    batch = np.full((len(sources), max(map(len, sources))), pad_id, np.int32)
    for row, ids in zip(batch, sources):
        row[: len(ids)] = ids
    return batch


def our_greedy(model, params, sources):
    """Our greedy outputs of every source, as id lists (EOS kept)."""
    tokens, lengths = greedy_decode(model, params, padded_batch(sources, model.config.pad_id), config=DECODE)
    return [row[:length].tolist() for row, length in zip(np.asarray(tokens), np.asarray(lengths))]


def greedy_pairs(model, params, tokenizer, directory, sources) -> list[tuple[list[int], list[int]]]:
    """(ours, CTranslate2's) greedy output of every source, as id lists (EOS included)."""
    translator = ctranslate2.Translator(str(directory))
    theirs = [ct2_translate(translator, tokenizer, ids, model.config.max_len, beam_size=1)[0][0] for ids in sources]
    return list(zip(our_greedy(model, params, sources), theirs))


def greedy_agreement(model_config, params, tokenizer, directory, sources):
    """(same, ties): how many sources CTranslate2's greedy output equals ours token for token (EOS included), and
    how many of the others first differ at a near-tie of our own logits (the two engines round differently, so
    an argmax between two tokens within TIE of each other may go either way on another CPU)."""
    model = Transformer(model_config.replace(dropout_rate=0.0))
    pairs = greedy_pairs(model, params, tokenizer, directory, sources)
    same = sum(ours == theirs for ours, theirs in pairs)
    ties = sum(first_difference_is_a_tie(model, params, ids, ours, theirs)
               for ids, (ours, theirs) in zip(sources, pairs) if ours != theirs)  # fmt: skip
    return same, ties


TIE = 1e-3  # logits of a trained tiny model are O(10); the engines agree on them to ~1e-5


def first_difference_is_a_tie(model, params, ids, ours, theirs):
    """Whether our logits for the two tokens where the outputs first part are within TIE of each other."""
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if at is None:  # one output is a prefix of the other: not an argmax tie
        return False
    cfg = model.config
    decoder_inputs = np.asarray([[cfg.bos_id, *ours[:at]]], np.int32)
    logits = model.apply({"params": params}, np.asarray([ids], np.int32), decoder_inputs)[0, at]
    return abs(float(logits[ours[at]]) - float(logits[theirs[at]])) < TIE


@pytest.mark.rounding
def test_greedy_outputs_are_identical(trained, sources):
    directory, output = trained
    model_config, params, tokenizer = ckpt.load_model_for_inference(directory)
    same, ties = greedy_agreement(model_config, params, tokenizer, output, sources)
    assert same + ties == SENTENCES, f"{SENTENCES - same - ties} outputs differ where our logits are not tied"
    assert same >= SENTENCES - 2  # a near-tie is rare: a wrong mapping differs on most sentences (below)


@pytest.mark.parametrize("break_it", ["unscaled_embeddings", "halves_positions"])
def test_a_wrong_mapping_changes_the_greedy_outputs(trained, sources, tmp_path, break_it):
    """The comparison above can fail: a spec that differs from the model gives other translations (counted without
    the near-tie check, which compiles a forward pass per differing sentence)."""
    directory, _ = trained
    model_config, params, tokenizer = ckpt.load_model_for_inference(directory)
    pieces = [tokenizer.processor.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    spec = export.build_spec(params, model_config, pieces, tokenizer.unk_id)
    if break_it == "unscaled_embeddings":
        spec.encoder.scale_embeddings = spec.decoder.scale_embeddings = False
    else:
        from transformer_jax.layers.embedding import sinusoidal_table

        table = sinusoidal_table(model_config.max_len, model_config.d_model, "halves")
        spec.encoder.position_encodings.encodings = spec.decoder.position_encodings.encodings = table
    spec.validate()  # turns the new values into CTranslate2 variables
    spec.optimize()
    spec.save(str(tmp_path))
    model = Transformer(model_config.replace(dropout_rate=0.0))
    pairs = greedy_pairs(model, params, tokenizer, tmp_path, sources)
    assert sum(ours == theirs for ours, theirs in pairs) < SENTENCES // 2


def perturbed_params(model_config, seed=0):
    """Initial params with every norm scale, bias and table moved off its initial value (so each mapping
    matters), drawn by the model's own init."""
    inputs = jnp.ones((1, 4), jnp.int32)
    params = Transformer(model_config).init(jax.random.PRNGKey(seed), inputs, inputs)["params"]
    flat = {path: np.asarray(value) for path, value in traverse_util.flatten_dict(nn.unbox(params)).items()}
    rng = np.random.default_rng(seed)
    for path, value in flat.items():
        if path[-1] in ("scale", "bias") or path[-1] == "position_embedding":
            flat[path] = value + 0.2 * rng.standard_normal(value.shape).astype(value.dtype)
    return traverse_util.unflatten_dict(flat)


@pytest.mark.parametrize(
    "changes",
    [
        {"norm_position": "pre"},
        {"position_encoding": "learned"},
        {"share_embeddings": False, "attention_bias": True},
        {"sinusoid_layout": "halves", "num_encoder_layers": 2},
    ],
    ids=["pre_ln", "learned_positions", "unshared_with_biases", "halves_deeper_encoder"],
)
@pytest.mark.rounding
def test_other_configs_map_exactly(trained, sources, tmp_path, changes):
    directory, _ = trained
    model_config, _, tokenizer = ckpt.load_model_for_inference(directory)
    model_config = model_config.replace(**changes)
    params = perturbed_params(model_config)
    export.export_ctranslate2(params, model_config, tokenizer, tmp_path / "ct2")
    same, ties = greedy_agreement(model_config, params, tokenizer, tmp_path / "ct2", sources)
    assert same + ties == SENTENCES and same >= SENTENCES - 2


@pytest.mark.rounding
def test_beam_differences_are_search_differences_not_model_differences(trained, sources):
    """Beam 4, alpha 0.6. CTranslate2 (length_penalty 0: raw log-probabilities) re-ranked by log P / lp(|Y|)
    often keeps a longer best than ours: its beam records a finished hypothesis only from the top candidates,
    where ours keeps every EOS extension of the 2*beam best (tensor2tensor). So the check is that the engines
    agree on the numbers: CTranslate2 scores our best exactly as we do, and that hypothesis scores at least as
    well as CTranslate2's own best, i.e. CTranslate2's search pruned it; where the tokens agree, so do scores."""
    directory, output = trained
    model_config, params, tokenizer = ckpt.load_model_for_inference(directory)
    model = Transformer(model_config.replace(dropout_rate=0.0))
    translator = ctranslate2.Translator(str(output))
    piece = tokenizer.processor.id_to_piece
    sequences, scores = beam_search(model, params, padded_batch(sources, model_config.pad_id), config=DECODE)
    same = 0
    for ids, hypothesis, score in zip(sources, np.asarray(sequences)[:, 0], np.asarray(scores)[:, 0]):
        ours = [token for token in hypothesis.tolist() if token != model_config.pad_id]
        ours_score = float(score)
        hypotheses, raw = ct2_translate(
            translator, tokenizer, ids, model_config.max_len, beam_size=4, num_hypotheses=4, length_penalty=0
        )
        penalised = [score / float(length_penalty(len(h), DECODE.alpha)) for h, score in zip(hypotheses, raw)]
        best = int(np.argmax(penalised))
        rescored = ours_score
        if (
            ours[-1] == model_config.eos_id
        ):  # score_batch appends an EOS, so a hypothesis cut at the limit is not rescored
            scored = translator.score_batch([[piece(token) for token in ids[:-1]]], [[piece(t) for t in ours[:-1]]])[0]
            assert len(scored.log_probs) == len(ours)  # the EOS is scored too, as our |Y| counts it
            rescored = sum(scored.log_probs) / float(length_penalty(len(ours), DECODE.alpha))
            assert rescored == pytest.approx(ours_score, abs=1e-2)
        if hypotheses[best] == ours:
            same += 1
            assert penalised[best] == pytest.approx(ours_score, abs=1e-2)
        else:
            assert rescored >= penalised[best] - 1e-2
    print(f"beam 4: CTranslate2's re-ranked best equals ours on {same} of {len(sources)} sentences")


def test_a_non_empty_output_is_refused_before_any_work(trained, tmp_path, capsys):
    directory, _ = trained
    output = tmp_path / "busy"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    code = cli.main(["export-ctranslate2", "--workdir", str(tmp_path / "no-such-run"), "--output", str(output)])
    err = capsys.readouterr().err
    assert code == 1 and "exists and is not empty" in err and "--force" in err
    assert [path.name for path in output.iterdir()] == ["keep.txt"]
    assert cli.main(["export-ctranslate2", "--workdir", str(directory), "--output", str(output), "--force"]) == 0
    assert sorted(path.name for path in output.iterdir()) == ["config.json", "model.bin", "shared_vocabulary.json"]


def test_an_unknown_quantization_is_refused(trained, tmp_path, capsys):
    directory, _ = trained
    code = cli.main(
        ["export-ctranslate2", "--workdir", str(directory), "--output", str(tmp_path / "q"), "--quantization", "int3"]
    )
    assert code == 1 and "--quantization int3 is unknown" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()


def test_int8_export_loads_and_translates(trained, sources, tmp_path):
    directory, _ = trained
    output = tmp_path / "int8"
    assert (
        cli.main(["export-ctranslate2", "--workdir", str(directory), "--output", str(output), "--quantization", "int8"])
        == 0
    )
    _, _, tokenizer = ckpt.load_model_for_inference(directory)
    hypotheses, _ = ct2_translate(ctranslate2.Translator(str(output)), tokenizer, sources[0], 32, beam_size=1)
    assert hypotheses[0] and all(0 <= token < tokenizer.vocab_size for token in hypotheses[0])


def test_a_tokenizer_that_does_not_fit_the_embeddings_is_refused(trained, tmp_path):
    directory, _ = trained
    model_config, params, tokenizer = ckpt.load_model_for_inference(directory)
    with pytest.raises(export.CTranslate2ExportError, match="has 200 pieces but the model's vocab_size is 208"):
        export.export_ctranslate2(params, model_config.replace(vocab_size=208), tokenizer, tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()


def test_a_config_ctranslate2_cannot_express_is_refused_before_any_work(trained, tmp_path, capsys):
    """d_k = d_v other than d_model / num_heads: TransformerSpec splits its fused QKV evenly by d_model / h."""
    directory, _ = trained
    odd = tmp_path / "odd"
    odd.mkdir()
    config = ckpt.load_config(directory)
    config["model"].update(key_dim=8, value_dim=24)
    ckpt.save_config(odd, config)
    code = cli.main(["export-ctranslate2", "--workdir", str(odd), "--output", str(tmp_path / "ct2")])
    err = capsys.readouterr().err
    assert code == 1 and "d_k = d_v = d_model / num_heads" in err and "key_dim=8 (d_k=8)" in err
    assert not (tmp_path / "ct2").exists()
