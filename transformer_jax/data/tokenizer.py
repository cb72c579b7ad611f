"""One SentencePiece vocabulary shared by source and target (paper §5.1: shared BPE of about 37,000 pieces).

`load_or_train_tokenizer(directory, pairs, vocab_size)` trains on a sample with as many source as target
sentences and writes `{directory}/spm.model`; when that file exists (a resumed run) it is loaded instead.
Special ids default to pad=0, bos=1, eos=2, unk=3, matching `ModelConfig(pad_id=0, bos_id=1, eos_id=2)`.

`normalization` is SentencePiece's normalization rule: "nmt_nfkc" (its default) keeps case; "nmt_nfkc_cf" also
folds case, so the model reads and writes lowercased text (the preprocessing of lowercased benchmarks such as
the published Multi30k results).

`Tokenizer.sample_pairs` segments by sampling instead (BPE-dropout, subword regularization: data.tokenizer_sampling),
reproducibly from a seed.

A vocab_size larger than the sample supports is an error that states the largest possible size; it is not
silently lowered (`hard_vocab_limit=False`), because the model's embedding table is sized from the config.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import logging
import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from transformer_jax.config import ModelConfig
from transformer_jax.data import marian_tokenizer
from transformer_jax.data.pairs import Pair
from transformer_jax.errors import DataError
from transformer_jax.experiment import TOKENIZER_NORMALIZATIONS, DataConfig

logger = logging.getLogger(__name__)

MODEL_FILENAME = "spm.model"


class Tokenizer:
    """Text ↔ ids with a SentencePiece model; `encode` adds no bos/eos, `decode` stops at eos."""

    def __init__(self, processor: spm.SentencePieceProcessor):
        self.processor = processor
        self.pad_id, self.bos_id = processor.pad_id(), processor.bos_id()
        self.eos_id, self.unk_id = processor.eos_id(), processor.unk_id()

    @classmethod
    def from_bytes(cls, model: bytes) -> Tokenizer:
        return cls(spm.SentencePieceProcessor(model_proto=model))

    @property
    def vocab_size(self) -> int:
        return self.processor.get_piece_size()

    @property
    def fingerprint(self) -> str:
        """sha256 of the SentencePiece model: equal for tokenizers that map text to the same ids."""
        return hashlib.sha256(self.processor.serialized_model_proto()).hexdigest()

    @property
    def normalization(self) -> str:
        """The SentencePiece normalization rule the model was trained with (see experiment.TOKENIZER_NORMALIZATIONS)."""
        from sentencepiece import sentencepiece_model_pb2

        proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # generated protobuf module
        proto.ParseFromString(self.processor.serialized_model_proto())
        return proto.normalizer_spec.name

    def model_config(self, model: ModelConfig) -> ModelConfig:
        """`model` with this vocabulary's size and special ids."""
        return model.replace(vocab_size=self.vocab_size, pad_id=self.pad_id, bos_id=self.bos_id, eos_id=self.eos_id)

    def encode(self, text: str) -> list[int]:
        """A source sentence's ids."""
        return self.processor.encode(text)

    def encode_target(self, text: str) -> list[int]:
        """A target sentence's ids: one shared model, the same as a source's (§5.1)."""
        return self.processor.encode(text)

    def encode_pairs(self, pairs: Iterable[Pair]) -> list[tuple[list[int], list[int]]]:
        """[(source pieces, target pieces)], the input of data.batching; encodes in one batched call."""
        pairs = list(pairs)
        sources = self.processor.encode([source for source, _ in pairs])
        targets = self.processor.encode([target for _, target in pairs])
        return list(zip(sources, targets))

    def sample_pairs(
        self, pairs: Sequence[Pair], alpha: float, seed: Sequence[int]
    ) -> list[tuple[list[int], list[int]]]:
        """`encode_pairs` with each segmentation sampled: a BPE model drops each merge with probability `alpha`
        (BPE-dropout, Provilkov et al. 2020), a unigram model samples from all segmentations with smoothing `alpha`
        (subword regularization, Kudo 2018). The same pairs, alpha and seed (e.g. (train seed, epoch)) give the
        same segmentations.

        SentencePiece samples from one generator per thread, seeded from its global seed when the thread first
        samples, so each call encodes on one fresh thread after setting that seed.
        """
        spm.set_random_generator_seed(int(np.random.SeedSequence(list(seed)).generate_state(1)[0]))

        def sample(texts: list[str]) -> list[list[int]]:
            return self.processor.encode(texts, enable_sampling=True, alpha=alpha, nbest_size=-1, num_threads=1)

        def sample_both_sides() -> list[tuple[list[int], list[int]]]:
            return list(zip(sample([source for source, _ in pairs]), sample([target for _, target in pairs])))

        with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="subword-sampling") as thread:
            return thread.submit(sample_both_sides).result()

    def epoch_sampler(
        self, pairs: Iterable[Pair], alpha: float, seed: int
    ) -> Callable[[int], list[tuple[list[int], list[int]]]]:
        """epoch -> `sample_pairs(pairs, alpha, (seed, epoch))`: the pairs segmented anew each epoch (TrainBatches)."""
        texts = list(pairs)
        return lambda epoch: self.sample_pairs(texts, alpha, (seed, epoch))

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenized text of `ids` up to the first eos, skipping pad and bos."""
        pieces = []
        for token in (int(token) for token in ids):
            if token == self.eos_id:
                break
            if token not in (self.pad_id, self.bos_id):
                pieces.append(token)
        return self.processor.decode(pieces)

    def check_special_ids(self, pad_id: int, bos_id: int, eos_id: int, unk_id: int) -> None:
        expected = {"pad": pad_id, "bos": bos_id, "eos": eos_id, "unk": unk_id}
        actual = {"pad": self.pad_id, "bos": self.bos_id, "eos": self.eos_id, "unk": self.unk_id}
        if actual != expected:
            raise DataError(
                f"The SentencePiece model has special ids {actual}, but {expected} were asked "
                f"for; they must match the model config. Retrain it in a fresh directory."
            )


def holds_marian_tokenizer(directory: str | Path) -> bool:
    """Whether a workdir's tokenizer is Marian's source.spm, target.spm and vocab.json (`transformer-jax
    import-hf`) rather than spm.model."""
    directory = Path(directory)
    return not (directory / MODEL_FILENAME).is_file() and (directory / marian_tokenizer.VOCAB).is_file()


# A run's tokenizer: the shared SentencePiece model (§5.1), or an imported Marian model's two (import-hf).
AnyTokenizer = Tokenizer | marian_tokenizer.MarianTokenizer


def load_tokenizer(directory: str | Path) -> AnyTokenizer:
    """The tokenizer a workdir holds: {directory}/spm.model (a trained run) or, without it, Marian's source.spm,
    target.spm and vocab.json (a model imported by `transformer-jax import-hf`)."""
    directory = Path(directory)
    if holds_marian_tokenizer(directory):
        return marian_tokenizer.MarianTokenizer.from_directory(directory)
    return Tokenizer.from_bytes((directory / MODEL_FILENAME).read_bytes())


def balanced_sample(pairs: Iterable[Pair], max_sentences: int, seed: int) -> list[str]:
    """Up to max_sentences // 2 pairs drawn uniformly (reservoir sampling), as [source, target, ...]."""
    rng = random.Random(seed)
    capacity = max_sentences // 2
    reservoir: list[Pair] = []
    for seen, pair in enumerate(pairs):
        if seen < capacity:
            reservoir.append(pair)
        else:
            slot = rng.randint(0, seen)
            if slot < capacity:
                reservoir[slot] = pair
    return [sentence for pair in reservoir for sentence in pair]


def train_tokenizer(
    sentences: Sequence[str],
    vocab_size: int,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    num_threads: int = 1,
    normalization: str = "nmt_nfkc",
    pad_id: int = 0,
    bos_id: int = 1,
    eos_id: int = 2,
    unk_id: int = 3,
) -> Tokenizer:
    """Trains in memory on `sentences` in the given order, without log output.

    The result is deterministic for a fixed `num_threads`, but differs between thread counts.
    """
    if model_type not in ("bpe", "unigram"):
        raise ValueError(f"model_type must be 'bpe' or 'unigram', got {model_type!r}.")
    if normalization not in TOKENIZER_NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {TOKENIZER_NORMALIZATIONS}, got {normalization!r}.")
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            pad_id=pad_id,
            bos_id=bos_id,
            eos_id=eos_id,
            unk_id=unk_id,
            input_sentence_size=0,
            shuffle_input_sentence=False,
            num_threads=num_threads,
            normalization_rule_name=normalization,
            minloglevel=2,
        )
    except RuntimeError as error:
        largest = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", str(error))
        if largest is None:
            raise
        raise DataError(
            f"vocab_size={vocab_size} is too large for the {len(sentences)} training sentences: "
            f"SentencePiece can make at most {largest.group(2)} pieces from them. Lower vocab_size (and the "
            f"model config's vocab_size with it) or train on more text."
        ) from error
    return Tokenizer.from_bytes(model.getvalue())


def load_or_train_tokenizer(
    directory: str | Path,
    pairs: Iterable[Pair],
    vocab_size: int,
    model_type: str = "bpe",
    max_sentences: int = 1_000_000,
    seed: int = 0,
    character_coverage: float = 1.0,
    num_threads: int = 1,
    normalization: str = "nmt_nfkc",
    pad_id: int = 0,
    bos_id: int = 1,
    eos_id: int = 2,
    unk_id: int = 3,
) -> Tokenizer:
    """Loads `{directory}/spm.model` if present, else trains on a balanced sample of `pairs` and saves it.

    `pairs` is only read when training. A loaded model must have `vocab_size` pieces, the given special ids
    and normalization, else this fails rather than train a second, different vocabulary over a saved run.
    """
    path = Path(directory) / MODEL_FILENAME
    special_ids = dict(pad_id=pad_id, bos_id=bos_id, eos_id=eos_id, unk_id=unk_id)
    if path.exists():
        tokenizer = Tokenizer.from_bytes(path.read_bytes())
        tokenizer.check_special_ids(**special_ids)
        if tokenizer.vocab_size != vocab_size:
            raise DataError(
                f"{path} has {tokenizer.vocab_size} pieces, but vocab_size={vocab_size} was asked "
                f"for. Use a fresh --workdir or set --config.data.vocab_size={tokenizer.vocab_size}."
            )
        if tokenizer.normalization != normalization:
            raise DataError(
                f"{path} was trained with normalization {tokenizer.normalization!r}, but {normalization!r} was "
                f"asked for. Use a fresh --workdir or set "
                f"--config.data.tokenizer_normalization={tokenizer.normalization}."
            )
        logger.info("Loaded the SentencePiece model %s (%d pieces).", path, tokenizer.vocab_size)
        return tokenizer
    sentences = balanced_sample(pairs, max_sentences, seed)
    logger.info("Training a %d-piece %s SentencePiece model on %d sentences.", vocab_size, model_type, len(sentences))
    tokenizer = train_tokenizer(
        sentences, vocab_size, model_type, character_coverage, num_threads, normalization, **special_ids
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as file:
        file.write(tokenizer.processor.serialized_model_proto())
    os.replace(file.name, path)  # atomic: a crash never leaves a half-written model
    logger.info("Saved the SentencePiece model to %s.", path)
    return tokenizer


def load_or_train_run_tokenizer(directory: Path, pairs: Iterable[Pair], data: DataConfig, seed: int) -> Tokenizer:
    """`load_or_train_tokenizer` with the data section's vocabulary options: the model `train` and `prepare` make."""
    return load_or_train_tokenizer(
        directory,
        pairs,
        data.vocab_size,
        model_type=data.tokenizer_model_type,
        normalization=data.tokenizer_normalization,
        max_sentences=data.tokenizer_max_sentences,
        seed=seed,
    )


def load_or_train_shared_tokenizer(workdir: Path, source, data: DataConfig, seed: int) -> AnyTokenizer:
    """`load_or_train_tokenizer` for a run of one or more processes: process 0 loads or trains {workdir}/spm.model
    on the source's training pairs (or copies data.prepared's, which encoded them); the other processes wait for it,
    then load it. A workdir holding an imported Marian tokenizer (fine-tuning an `import-hf` model) keeps it."""
    import jax

    if holds_marian_tokenizer(workdir):
        if data.tokenizer_sampling:
            raise DataError(
                f"data.tokenizer_sampling={data.tokenizer_sampling}: an imported Marian tokenizer ({workdir}) "
                "segments without sampling; set --config.data.tokenizer_sampling=0."
            )
        return marian_tokenizer.MarianTokenizer.from_directory(workdir)

    if jax.process_index() == 0:
        prepared = Path(data.prepared) / MODEL_FILENAME
        if data.prepared and not (workdir / MODEL_FILENAME).exists():  # the model the prepared pairs were encoded with
            if not prepared.is_file():
                raise DataError(f"data.prepared={data.prepared!r} has no {MODEL_FILENAME}: is it a `prepare` output?")
            workdir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(prepared, workdir / MODEL_FILENAME)
        tokenizer = load_or_train_run_tokenizer(workdir, source.pairs("train"), data, seed)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("transformer_jax: tokenizer ready")
    if jax.process_index() != 0:
        path = workdir / MODEL_FILENAME
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found on process {jax.process_index()} after process 0 wrote it: "
                f"the workdir must be on a filesystem that every process shares."
            )
        tokenizer = Tokenizer.from_bytes(path.read_bytes())
    return tokenizer
