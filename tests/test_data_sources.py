"""Local parallel files (errors, skips, gzip), the tfds loader's direction, and the source factory."""

import gzip

import pytest

from transformer_jax.data import SPLITS, make_source
from transformer_jax.data.local_files import LocalFilesSource


def write(path, lines, opener=open):
    with opener(path, "wb") as file:
        file.write(b"".join(line + b"\n" for line in lines))


def test_local_files_pairs_in_order(tmp_path):
    write(tmp_path / "train.en", [b"a house", b"two cats"])
    write(tmp_path / "train.de", [b"ein Haus", b"zwei Katzen"])
    source = make_source("local", directory=tmp_path)
    assert list(source.pairs("train")) == [("a house", "ein Haus"), ("two cats", "zwei Katzen")]
    reverse = make_source("local", directory=tmp_path, source_lang="de", target_lang="en")
    assert next(reverse.pairs("train")) == ("ein Haus", "a house")


def test_gzip_and_windows_line_ends(tmp_path):
    write(tmp_path / "test.en.gz", [b"good morning\r"], gzip.open)
    write(tmp_path / "test.de", [b"guten Morgen\r"])
    assert list(LocalFilesSource(tmp_path).pairs("test")) == [("good morning", "guten Morgen")]


def test_missing_file_names_the_expected_path(tmp_path):
    write(tmp_path / "val.en", [b"x"])
    source = make_source("multi30k", directory=tmp_path)  # validation is stored as val.*
    with pytest.raises(FileNotFoundError, match=r"'de' side of split 'validation'.*val\.de.*val\.en"):
        next(source.pairs("validation"))


def test_mismatched_line_counts_give_both_counts(tmp_path):
    write(tmp_path / "train.en", [b"a", b"b", b"c"])
    write(tmp_path / "train.de", [b"a", b"b"])
    with pytest.raises(ValueError, match=r"train\.en has 3 lines but .*train\.de has 2"):
        list(LocalFilesSource(tmp_path).pairs("train"))


def test_undecodable_bytes_name_file_and_line(tmp_path):
    write(tmp_path / "train.en", [b"fine", b"also fine", b"caf\xe9"])  # latin-1, not UTF-8
    write(tmp_path / "train.de", [b"gut", b"auch gut", b"Caf\xc3\xa9"])
    with pytest.raises(ValueError, match=r"train\.en, line 3: not valid UTF-8.*iconv -f LATIN1 -t UTF-8 train\.en"):
        list(LocalFilesSource(tmp_path).pairs("train"))


def test_empty_and_overlong_pairs_are_skipped_and_counted(tmp_path):
    write(tmp_path / "train.en", [b"one", b"", b"three", b"x" * 11, b"  five  "])
    write(tmp_path / "train.de", [b"eins", b"zwei", b"   ", b"vier", "fünf".encode()])
    source = LocalFilesSource(tmp_path, max_chars=10)
    assert list(source.pairs("train")) == [("one", "eins"), ("five", "fünf")]
    counts = source.skipped["train"]
    assert (counts.kept, counts.empty, counts.too_long) == (2, 2, 1)


def test_unknown_split_and_kind():
    with pytest.raises(ValueError, match="Unknown split 'dev'"):
        next(make_source("builtin").pairs("dev"))
    with pytest.raises(ValueError, match="Unknown source kind 'wmt'"):
        make_source("wmt")
    with pytest.raises(TypeError, match="it takes .*'directory'"):
        make_source("local", folder="x")


def test_tfds_wmt14_is_english_to_german_by_default(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    requests = []

    def fake_data_source(builder, split, **kwargs):
        """Stands in for the prepared ArrayRecord files; tfds stores wmt14 'de-en' German first."""
        requests.append((builder.name, split))
        return [{"de": b"Guten Morgen", "en": b"good morning"}, {"de": b"Die Katze", "en": b"The cat"}]

    with tfds.testing.mock_data(as_data_source_fn=fake_data_source, data_dir=str(tmp_path)):
        english_to_german = make_source("tfds", data_dir=str(tmp_path))
        assert list(english_to_german.pairs("validation")) == [
            ("good morning", "Guten Morgen"),
            ("The cat", "Die Katze"),
        ]
        german_to_english = make_source("tfds", source_lang="de", target_lang="en")
        assert next(german_to_english.pairs("test")) == ("Guten Morgen", "good morning")
        with pytest.raises(KeyError, match=r"keys \['de', 'en'\].*source_lang='fr'"):
            next(make_source("tfds", source_lang="fr").pairs("train"))
    assert requests[:2] == [("wmt14_translate", "validation"), ("wmt14_translate", "test")]
    assert english_to_german.skipped["validation"].kept == 2


def test_every_kind_serves_every_split(tmp_path):
    for split in SPLITS:
        write(tmp_path / f"{split}.en", [b"hello"])
        write(tmp_path / f"{split}.de", [b"hallo"])
    for source in (
        make_source("local", directory=tmp_path),
        make_source("builtin", split_sizes={"train": 5, "validation": 5, "test": 5}),
    ):
        for split in SPLITS:
            assert all(isinstance(text, str) and text for pair in source.pairs(split) for text in pair)


def test_tfds_dataset_not_prepared_says_how_to_prepare_it(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    with pytest.raises(FileNotFoundError, match=r"not prepared under .*tfds build wmt14_translate/de-en"):
        next(make_source("tfds", data_dir=str(tmp_path / "empty")).pairs("train"))
