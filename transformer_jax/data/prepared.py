"""Training pairs tokenized once, offline, into sharded NumPy files that every process reads by index.

    transformer-jax prepare --config experiments/base.py --output DIR      # then train with data.prepared=DIR

DIR holds the run's SentencePiece model (`spm.model`), the shards and one manifest per part:

    train-00000.tokens.npy     every pair's source pieces then its target pieces, end to end (no bos/eos): uint16
                               where the vocabulary allows, else int32
    train-00000.lengths.npy    [pairs, 2] int32: the pieces of each side (where each pair starts, and the batch plan)
    part-0-of-1.json           the shards that part wrote, their pair counts, the tokenizer's fingerprint, the languages

Shard k holds the training pairs k·chunk_pairs .. (k+1)·chunk_pairs - 1 of the source, in order. A job of several
hosts prepares with `--part I/N` on each: every part reads the text and encodes the shards k with k % N == I, each
in a worker process; the data is complete when all N manifests are there.

The layout of Megatron-LM's indexed datasets and nanoGPT's token files rather than ArrayRecord: a batch reads a
thousand pairs scattered over every shard, one `pread` of about 1.5 µs each, while an ArrayRecord reader costs
about 4.5 ms of CPU a read call (one per shard a batch) and 6.5 µs a record. Not memory-mapped: a mapping counts
every page the kernel maps around a fault in the process's RSS (a batch of 1000 pairs mapped 640 MB here). A process's
own memory is the lengths (12 bytes a pair with the starts) and the epoch's plan; the page cache is shared.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import json
import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from transformer_jax.data.pairs import Pair
from transformer_jax.data.token_pairs import Ragged, gather
from transformer_jax.errors import DataError
from transformer_jax.experiment import DataConfig

FORMAT = 1


def shard_name(shard: int) -> str:
    return f"train-{shard:05d}"


def manifest_name(part: int, parts: int) -> str:
    return f"part-{part}-of-{parts}.json"


def record_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What one part of `prepare` wrote."""

    part: int
    parts: int
    chunk_pairs: int
    shards: dict[int, int]  # shard -> pairs in it
    tokenizer: str  # sha256 of spm.model (Tokenizer.fingerprint)
    dtype: str
    source_lang: str
    target_lang: str
    format: int = FORMAT

    def write(self, directory: Path) -> None:
        path = directory / manifest_name(self.part, self.parts)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(dataclasses.asdict(self), indent=1) + "\n")
        os.replace(temporary, path)

    @classmethod
    def read(cls, path: Path) -> Manifest:
        fields = json.loads(path.read_text())
        fields["shards"] = {int(shard): pairs for shard, pairs in fields["shards"].items()}
        return cls(**fields)


# ---- writing (in worker processes) ----

_worker_tokenizer = None


def _load_worker_tokenizer(model: bytes) -> None:
    global _worker_tokenizer
    import sentencepiece as spm

    _worker_tokenizer = spm.SentencePieceProcessor(model_proto=model)


def _write_shard(directory: str, shard: int, pairs: list[Pair], dtype: str) -> tuple[int, int]:
    """Encodes `pairs` and writes shard `shard` (tokens, then lengths; each renamed into place when complete)."""
    assert _worker_tokenizer is not None
    sources = _worker_tokenizer.encode([source for source, _ in pairs])
    targets = _worker_tokenizer.encode([target for _, target in pairs])
    lengths = np.array([(len(source), len(target)) for source, target in zip(sources, targets)], np.int32)
    pieces = itertools.chain.from_iterable(itertools.chain(source, target) for source, target in zip(sources, targets))
    stem = Path(directory) / shard_name(shard)
    for suffix, array in (
        (".tokens.npy", np.fromiter(pieces, dtype, int(lengths.sum()))),
        (".lengths.npy", lengths.reshape(-1, 2)),
    ):
        with open(stem.with_suffix(suffix + ".tmp"), "wb") as file:
            np.save(file, array)
        os.replace(stem.with_suffix(suffix + ".tmp"), stem.with_suffix(suffix))
    return shard, len(pairs)


def _chunks(pairs: Iterable[Pair], size: int) -> Iterator[list[Pair]]:
    iterator = iter(pairs)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def write_prepared(
    pairs: Iterable[Pair],
    tokenizer_model: bytes,
    directory: Path,
    dtype: str,
    *,
    chunk_pairs: int,
    part: tuple[int, int] = (0, 1),
    workers: int = 0,
    progress: Callable[[int], None] = lambda pairs: None,
) -> dict[int, int]:
    """Encodes the shards of `part` (index, count) from `pairs` in `workers` processes (0: one per core); returns
    {shard: pairs} of those written. `progress(pairs)` after each chunk read."""
    workers = workers or os.cpu_count() or 1
    done: dict[int, int] = {}
    context = multiprocessing.get_context("spawn")  # no forked copy of a parent that may hold jax threads
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=_load_worker_tokenizer, initargs=(tokenizer_model,)
    ) as pool:
        pending: set[concurrent.futures.Future] = set()
        for shard, chunk in enumerate(_chunks(pairs, chunk_pairs)):
            progress(len(chunk))
            if shard % part[1] != part[0]:
                continue
            if len(pending) > workers:  # a bounded number of chunks in memory
                finished, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                done.update(future.result() for future in finished)
            pending.add(pool.submit(_write_shard, str(directory), shard, chunk, dtype))
        done.update(future.result() for future in concurrent.futures.as_completed(pending))
    return dict(sorted(done.items()))


# ---- reading ----


class PreparedPairs:
    """The prepared training pairs of a directory, by index (data.token_pairs.TokenPairs): the lengths and where each
    pair starts in memory (12 bytes a pair), the pieces read from the shards with one `pread` a pair when a batch needs
    them (the page cache is the kernel's, shared by the processes of a host)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.manifest = read_manifests(self.directory)
        shards = sorted(self.manifest.shards)
        lengths = [np.load(self.directory / f"{shard_name(shard)}.lengths.npy").reshape(-1, 2) for shard in shards]
        self._lengths = np.concatenate(lengths)  # [pairs, 2]
        self._starts = np.concatenate([_starts(pairs) for pairs in lengths])  # [pairs] in its shard's tokens
        self._first = np.cumsum([0] + [len(pairs) for pairs in lengths])  # [shards + 1] each shard's first pair
        self._dtype = np.dtype(self.manifest.dtype)
        self._files = [_TokenFile(self.directory / f"{shard_name(shard)}.tokens.npy") for shard in shards]

    def __len__(self) -> int:
        return len(self._lengths)

    def lengths(self) -> np.ndarray:
        return self._lengths

    def read(self, indices: np.ndarray) -> tuple[Ragged, Ragged]:
        source_lengths, target_lengths = self._lengths[indices].T
        shards = (np.searchsorted(self._first, indices, side="right") - 1).tolist()
        starts, sizes = self._starts[indices].tolist(), (source_lengths + target_lengths).tolist()
        pairs = np.frombuffer(
            b"".join(self._files[shard].read(start, size) for shard, start, size in zip(shards, starts, sizes)),
            self._dtype,
        )  # every pair's source then target pieces, end to end
        pair_starts = np.cumsum(source_lengths + target_lengths) - (source_lengths + target_lengths)
        return (
            Ragged(gather(pairs, pair_starts, source_lengths).astype(np.int32), source_lengths),
            Ragged(gather(pairs, pair_starts + source_lengths, target_lengths).astype(np.int32), target_lengths),
        )


class _TokenFile:
    """A shard's tokens.npy, read by ranges of tokens."""

    def __init__(self, path: Path):
        with open(path, "rb") as file:
            version = np.lib.format.read_magic(file)
            header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            self.itemsize = header(file)[2].itemsize
            self.offset = file.tell()  # where the array's data begins
        self.descriptor = os.open(path, os.O_RDONLY)

    def read(self, start: int, count: int) -> bytes:
        return os.pread(self.descriptor, count * self.itemsize, self.offset + start * self.itemsize)

    def __del__(self) -> None:
        os.close(self.descriptor)


def _starts(lengths: np.ndarray) -> np.ndarray:
    """[pairs] where each pair of a shard starts in its tokens, in the smallest unsigned type that holds them."""
    ends = np.cumsum(lengths.sum(axis=1, dtype=np.int64))
    return (ends - lengths.sum(axis=1)).astype(np.min_scalar_type(int(ends[-1]) if len(ends) else 0))


def check_prepared(data: DataConfig, tokenizer_fingerprint: str | None = None) -> Manifest:
    """The manifest of data.prepared, after checking that it is complete, holds the run's language pair and (given
    the fingerprint of the run's tokenizer) was encoded with it."""
    manifest = read_manifests(Path(data.prepared))
    if (manifest.source_lang, manifest.target_lang) != (data.source_lang, data.target_lang):
        raise DataError(
            f"data.prepared={data.prepared!r} holds {manifest.source_lang}->{manifest.target_lang} pairs, but the run "
            f"translates {data.source_lang}->{data.target_lang}: prepare that direction into another directory."
        )
    if tokenizer_fingerprint is not None and tokenizer_fingerprint != manifest.tokenizer:
        raise DataError(
            f"data.prepared={data.prepared!r} was encoded with another SentencePiece model than the workdir's: a run "
            f"takes {data.prepared}/spm.model when its workdir has none, so use a fresh --workdir."
        )
    return manifest


def read_manifests(directory: Path) -> Manifest:
    """The manifests of every part merged into one (part 0 of 1), after checking that all parts are there, agree
    and cover shards 0 .. K-1 whose files exist."""
    paths = sorted(directory.glob("part-*-of-*.json"))
    if not paths:
        raise DataError(
            f"{directory} holds no prepared training data (no part-*-of-*.json). Write it with `transformer-jax "
            f"prepare --config ... --output {directory}`; a `prepare` that was stopped writes its manifest last."
        )
    manifests = [Manifest.read(path) for path in paths]
    first = manifests[0]
    parts = {manifest.part for manifest in manifests if manifest.parts == first.parts}
    if len(parts) != len(manifests) or parts != set(range(first.parts)):
        raise DataError(
            f"{directory} holds the manifests {[path.name for path in paths]}, not parts 0..{first.parts - 1} of "
            f"{first.parts}: run `prepare --part I/{first.parts}` for the missing parts (or prepare afresh)."
        )
    keys = ("chunk_pairs", "tokenizer", "dtype", "source_lang", "target_lang", "format")
    for manifest in manifests:
        if any(getattr(manifest, key) != getattr(first, key) for key in keys):
            raise DataError(f"The parts in {directory} were prepared differently ({keys} differ); prepare afresh.")
    shards = {shard: pairs for manifest in manifests for shard, pairs in manifest.shards.items()}
    if sorted(shards) != list(range(len(shards))):
        raise DataError(f"{directory}: the parts' shards are not 0..{len(shards) - 1}; prepare afresh.")
    for shard in shards:
        for suffix in (".tokens.npy", ".lengths.npy"):
            if not (directory / f"{shard_name(shard)}{suffix}").is_file():
                raise DataError(f"{directory}: {shard_name(shard)}{suffix} is missing; prepare afresh.")
    return dataclasses.replace(first, part=0, parts=1, shards=shards)


def prepare(
    data: DataConfig, output: Path, *, seed: int, part: tuple[int, int], workers: int, chunk_pairs: int
) -> Manifest:
    """`transformer-jax prepare`: the SentencePiece model of `data` (trained on the training split as `train` trains
    it, or the one already in `output`) and this part's shards of the encoded training split."""
    from tqdm import tqdm

    from transformer_jax.data.sources import check_splits_not_empty, source_from_config
    from transformer_jax.data.tokenizer import load_or_train_run_tokenizer

    source = source_from_config(data, splits=("train",))
    check_splits_not_empty(source, splits=("train",))
    output.mkdir(parents=True, exist_ok=True)
    existing = sorted(path.name for path in output.glob("part-*-of-*.json"))
    if manifest_name(*part) in existing:
        raise DataError(f"{output} already holds {manifest_name(*part)}; give a fresh --output (or delete it).")
    tokenizer = load_or_train_run_tokenizer(output, source.pairs("train"), data, seed)

    dtype = record_dtype(tokenizer.vocab_size).name
    with tqdm(desc=f"prepare part {part[0]}/{part[1]}", unit=" pairs", unit_scale=True, mininterval=5) as bar:
        shards = write_prepared(
            source.pairs("train"),
            tokenizer.processor.serialized_model_proto(),
            output,
            dtype,
            chunk_pairs=chunk_pairs,
            part=part,
            workers=workers,
            progress=bar.update,
        )
    manifest = Manifest(*part, chunk_pairs, shards, tokenizer.fingerprint, dtype, data.source_lang, data.target_lang)
    manifest.write(output)  # last: a stopped prepare leaves no manifest, so no one reads its shards
    return manifest
