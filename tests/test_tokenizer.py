"""Shared SentencePiece vocabulary: special ids, round trips, balanced sample, reuse from disk."""

import pytest

from transformer_jax.data.builtin_corpus import generate_corpus
from transformer_jax.data.tokenizer import (
    MODEL_FILENAME,
    balanced_sample,
    load_or_train_tokenizer,
    train_tokenizer,
)

VOCAB_SIZE = 400


@pytest.fixture(scope="module")
def corpus():
    return generate_corpus(seed=0, split_sizes={"train": 4000, "validation": 200})


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    directory = tmp_path_factory.mktemp("workdir")
    return directory, load_or_train_tokenizer(directory, corpus["train"], VOCAB_SIZE, max_sentences=4000)


def test_special_ids(trained):
    _, tokenizer = trained
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id) == (0, 1, 2, 3)
    assert [tokenizer.processor.id_to_piece(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]
    assert tokenizer.vocab_size == VOCAB_SIZE


def test_round_trip_on_unseen_sentences(trained, corpus):
    _, tokenizer = trained
    for pair in corpus["validation"]:
        for text in pair:
            ids = tokenizer.encode(text)
            assert min(ids) > 3  # no bos/eos added, nothing unknown
            assert tokenizer.decode(ids) == text


def test_decode_stops_at_eos_and_skips_pad_and_bos(trained):
    _, tokenizer = trained
    ids = tokenizer.encode("zwei kleine rote Katzen")
    assert tokenizer.decode([1] + ids + [2] + tokenizer.encode("der Hund") + [0, 0]) == "zwei kleine rote Katzen"
    assert tokenizer.decode([0, 1] + ids[:2] + [0] + ids[2:]) == "zwei kleine rote Katzen"


def test_reuse_from_disk_gives_identical_ids(trained, corpus):
    directory, tokenizer = trained
    assert (directory / MODEL_FILENAME).is_file()

    def must_not_be_read():
        raise AssertionError("a saved model must be reused, not retrained")
        yield

    reloaded = load_or_train_tokenizer(directory, must_not_be_read(), VOCAB_SIZE)
    for english, german in corpus["validation"][:50]:
        assert reloaded.encode(english) == tokenizer.encode(english)
        assert reloaded.encode_pairs([(english, german)]) == [(tokenizer.encode(english), tokenizer.encode(german))]
    assert reloaded.encode_pairs([]) == []
    with pytest.raises(
        ValueError, match=f"has {VOCAB_SIZE} pieces, but vocab_size=500.*--config.data.vocab_size={VOCAB_SIZE}"
    ):
        load_or_train_tokenizer(directory, [], 500)
    with pytest.raises(ValueError, match="special ids"):
        load_or_train_tokenizer(directory, [], VOCAB_SIZE, pad_id=3, unk_id=0)


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_training_is_deterministic(corpus, model_type):
    sentences = balanced_sample(corpus["train"], 2000, seed=0)
    first = train_tokenizer(sentences, 300, model_type)
    second = train_tokenizer(sentences, 300, model_type)
    assert first.processor.serialized_model_proto() == second.processor.serialized_model_proto()


def test_balanced_sample(corpus):
    sentences = balanced_sample(corpus["train"], 101, seed=3)
    assert len(sentences) == 100
    pairs = list(zip(sentences[::2], sentences[1::2]))  # as many source as target sentences
    assert set(pairs) <= set(corpus["train"]) and len(set(pairs)) == 50
    assert balanced_sample(corpus["train"], 101, seed=3) == sentences
    assert balanced_sample(corpus["train"], 101, seed=4) != sentences
    assert len(balanced_sample(corpus["train"][:10], 100, seed=0)) == 20  # small corpora: all of it


def test_too_large_vocabulary_says_the_maximum():
    with pytest.raises(ValueError, match=r"vocab_size=5000 is too large .* at most \d+ pieces"):
        train_tokenizer(["ein kleiner Hund", "a small dog"] * 5, 5000)


def test_case_folding_normalization_lowercases_what_it_reads_and_is_kept_with_the_model(trained, corpus, tmp_path):
    _, cased = trained
    assert cased.normalization == "nmt_nfkc" and cased.decode(cased.encode("Der Hund")) == "Der Hund"
    folded = load_or_train_tokenizer(
        tmp_path, corpus["train"], VOCAB_SIZE, max_sentences=4000, normalization="nmt_nfkc_cf"
    )
    assert folded.normalization == "nmt_nfkc_cf"
    for english, german in corpus["validation"][:50]:
        assert folded.decode(folded.encode(german)) == german.lower()
        assert folded.encode(english.upper()) == folded.encode(english.lower())
    with pytest.raises(ValueError, match="normalization 'nmt_nfkc_cf'.*tokenizer_normalization=nmt_nfkc_cf"):
        load_or_train_tokenizer(tmp_path, [], VOCAB_SIZE)
    with pytest.raises(ValueError, match="normalization must be one of"):
        train_tokenizer(["a b c"], 10, normalization="lowercase")


def test_sampled_segmentations_are_lossless_reproducible_and_finer_the_higher_alpha(trained, corpus):
    """BPE-dropout (data.tokenizer_sampling): every sampled segmentation decodes to its text; the same seed gives the
    same pieces whatever was sampled in between, another epoch others; a higher drop probability gives more pieces,
    and dropping (almost) every merge leaves (almost) single characters."""
    _, tokenizer = trained
    pairs = corpus["validation"][:100]
    best = tokenizer.encode_pairs(pairs)
    sampled = tokenizer.sample_pairs(pairs, 0.1, seed=(0, 0))
    for (source, target), (source_ids, target_ids) in zip(pairs, sampled):
        assert tokenizer.decode(source_ids) == source and tokenizer.decode(target_ids) == target
    assert tokenizer.sample_pairs(pairs, 0.1, seed=(0, 1)) != sampled
    tokenizer.processor.encode(pairs[0][0], enable_sampling=True, alpha=0.1)  # the main thread's generator moves on
    assert tokenizer.sample_pairs(pairs, 0.1, seed=(0, 0)) == sampled

    def pieces(segmented):
        return sum(len(source) + len(target) for source, target in segmented)

    characters = sum(len(source.replace(" ", "")) + len(target.replace(" ", "")) for source, target in pairs)
    assert pieces(best) < pieces(sampled) < pieces(tokenizer.sample_pairs(pairs, 0.5, seed=(0, 0)))
    assert pieces(tokenizer.sample_pairs(pairs, 0.999, seed=(0, 0))) >= 0.98 * characters
