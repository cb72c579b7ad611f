"""Prepared training data (data/prepared.py) against its oracles: SentencePiece on the text, and the batches the
in-memory path makes from the same pairs; parts written separately read as one; bad directories are named."""

import subprocess
import sys

import numpy as np
import pytest
from conftest import SMALL_CORPUS

from transformer_jax.data.batching import TrainBatches
from transformer_jax.data.prepared import PreparedPairs, manifest_name, prepare
from transformer_jax.data.sources import source_from_config
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import DataError
from transformer_jax.experiment import DataConfig

DATA = DataConfig(source="builtin", vocab_size=200, options={"split_sizes": SMALL_CORPUS})
CHUNK = 400  # 1500 pairs: shards of 400, 400, 400, 300


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The small builtin corpus prepared in two parts, as two hosts would."""
    directory = tmp_path_factory.mktemp("prepared")
    for part in range(2):
        prepare(DATA, directory, seed=0, part=(part, 2), workers=1, chunk_pairs=CHUNK)
    return directory


def text_pairs():
    return list(source_from_config(DATA, ("train",)).pairs("train"))


def pairs_at(pairs, indices):
    """[(source ids, target ids)] of the pairs at `indices`, from the flat arrays `read` returns."""
    sources, targets = pairs.read(np.asarray(indices))
    split = [np.split(side.tokens, np.cumsum(side.lengths)[:-1]) for side in (sources, targets)]
    return [(source.tolist(), target.tolist()) for source, target in zip(*split)]


def test_the_parts_read_as_the_tokenizers_ids_of_every_pair_in_order(prepared):
    pairs = PreparedPairs(prepared)
    assert pairs.manifest.shards == {0: 400, 1: 400, 2: 400, 3: 300}
    assert sorted(path.name for path in prepared.glob("part-*")) == [manifest_name(0, 2), manifest_name(1, 2)]
    processor = Tokenizer.from_bytes((prepared / "spm.model").read_bytes()).processor
    text = text_pairs()
    expected = [(processor.encode(source), processor.encode(target)) for source, target in text]
    order = np.random.default_rng(0).permutation(len(text))  # random access across the shards of both parts
    assert pairs_at(pairs, order) == [expected[index] for index in order]
    np.testing.assert_array_equal(pairs.lengths(), [(len(s), len(t)) for s, t in expected])


@pytest.mark.parametrize("pack", [False, True])
def test_prepared_pairs_make_the_in_memory_paths_batches(prepared, pack):
    """Same seed, same pairs: every batch of two epochs equal, on each of two shards."""
    tokenizer = Tokenizer.from_bytes((prepared / "spm.model").read_bytes())
    in_memory = tokenizer.encode_pairs(text_pairs())
    options = dict(tokens_per_batch=256, max_len=24, seed=3, pack=pack, shard_count=2, batch_multiple=2)
    for shard in range(2):
        expected = TrainBatches(in_memory, shard_index=shard, **options)
        actual = TrainBatches(PreparedPairs(prepared), shard_index=shard, **options)
        assert actual.dropped == expected.dropped > 0
        count = len(expected.epoch_plan(0)) + len(expected.epoch_plan(1))
        for _ in range(count):
            want, got = next(expected), next(actual)
            assert want.keys() == got.keys()
            for name in want:
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        assert actual.state() == expected.state() == {"epoch": 2, "index": 0}


def test_incomplete_or_repeated_preparation_is_named(prepared, tmp_path):
    with pytest.raises(DataError, match="no prepared training data"):
        PreparedPairs(tmp_path)
    with pytest.raises(DataError, match="already holds part-1-of-2.json"):
        prepare(DATA, prepared, seed=0, part=(1, 2), workers=1, chunk_pairs=CHUNK)
    (tmp_path / manifest_name(0, 2)).write_bytes((prepared / manifest_name(0, 2)).read_bytes())
    with pytest.raises(DataError, match=r"not parts 0\.\.1 of 2.*--part I/2"):
        PreparedPairs(tmp_path)


def test_the_command_refuses_a_bad_part_and_training_a_direction_it_was_not_prepared_for(prepared, tmp_path):
    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "transformer_jax", *args], capture_output=True, text=True, timeout=300
        )

    bad = run("prepare", "--config", "experiments/tiny.py", "--output", str(tmp_path / "p"), "--part", "2/2")
    assert bad.returncode == 2 and "--part 2/2: give I/N with 0 <= I < N" in bad.stderr
    assert not (tmp_path / "p").exists()
    other_direction = run(
        "train",
        "--config",
        "experiments/tiny.py",
        "--workdir",
        str(tmp_path / "run"),
        f"--config.data.prepared={prepared}",
        "--config.data.source_lang=de",
        "--config.data.target_lang=en",
        "--config.data.vocab_size=200",
        f"--config.data.options.split_sizes={SMALL_CORPUS!r}",
    )
    assert other_direction.returncode == 1
    assert "holds en->de pairs, but the run translates de->en" in other_direction.stderr


def test_tfds_is_a_text_source_of_prepare(tmp_path):
    """`prepare` reads data.source=tfds through tfds.data_source, as training does (mocked: no dataset is built
    here); the shards hold the tokenizer's ids of its pairs, English first."""
    tfds = pytest.importorskip("tensorflow_datasets")
    examples = [{"de": f"die Katze Nummer {i}".encode(), "en": f"the cat number {i}".encode()} for i in range(300)]
    data = DataConfig(source="tfds", path=str(tmp_path), vocab_size=40, tokenizer_model_type="unigram")
    with tfds.testing.mock_data(as_data_source_fn=lambda builder, split, **kwargs: examples, data_dir=str(tmp_path)):
        prepare(data, tmp_path / "prepared", seed=0, part=(0, 1), workers=1, chunk_pairs=128)
    pairs = PreparedPairs(tmp_path / "prepared")
    processor = Tokenizer.from_bytes((tmp_path / "prepared" / "spm.model").read_bytes()).processor
    assert pairs_at(pairs, np.arange(len(examples))) == [
        (processor.encode(example["en"].decode()), processor.encode(example["de"].decode())) for example in examples
    ]


def test_a_position_saved_by_one_process_resumes_on_two(prepared):
    """The data position is global: two processes restored from one process's state read the two halves of the
    rows the one process would have read next (same data x fsdp size: rows a multiple of 2 either way)."""
    options = dict(tokens_per_batch=256, max_len=24, seed=1, batch_multiple=2)
    one = TrainBatches(PreparedPairs(prepared), **options)
    for _ in range(len(one.epoch_plan(0)) - 2):
        next(one)
    saved = one.state()
    two = [TrainBatches(PreparedPairs(prepared), shard_index=i, shard_count=2, **options) for i in range(2)]
    for shard in two:
        shard.restore(saved)
    for _ in range(4):  # into the next epoch
        whole, halves = next(one), [next(shard) for shard in two]
        for name in whole:
            np.testing.assert_array_equal(np.concatenate([half[name] for half in halves]), whole[name])
