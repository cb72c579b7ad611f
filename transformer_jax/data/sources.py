"""`make_source(kind, **options)`: one entry point to every parallel-text source; `source_from_config(data)`.

Every source yields (source text, target text) pairs by split: 'train', 'validation', 'test'.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path

from transformer_jax.data.builtin_corpus import BuiltinCorpusSource
from transformer_jax.data.local_files import MULTI30K_SPLIT_PREFIXES, LocalFilesSource
from transformer_jax.data.pairs import SPLITS, ParallelSource
from transformer_jax.data.tfds_source import TfdsSource
from transformer_jax.experiment import SOURCES_WITH_DIRECTORY, ConfigError, DataConfig

SOURCE_KINDS: dict[str, Callable[..., ParallelSource]] = {
    "builtin": BuiltinCorpusSource,
    "local": LocalFilesSource,
    "multi30k": functools.partial(LocalFilesSource, split_prefixes=MULTI30K_SPLIT_PREFIXES),
    "tfds": TfdsSource,
}


def make_source(kind: str, **options) -> ParallelSource:
    """E.g. make_source('tfds', data_dir=...), make_source('local', directory=..., source_lang='en')."""
    if kind not in SOURCE_KINDS:
        raise ValueError(f"Unknown source kind {kind!r}; use one of {sorted(SOURCE_KINDS)}.")
    factory = SOURCE_KINDS[kind]
    try:
        return factory(**options)
    except TypeError as error:
        cls = factory.func if isinstance(factory, functools.partial) else factory
        fields = [field.name for field in dataclasses.fields(cls) if field.init]  # type: ignore[arg-type]
        raise TypeError(f"Bad options for source {kind!r} ({error}); it takes {fields}.") from error


def source_from_config(data: DataConfig, splits: tuple[str, ...] = ("train", "validation")) -> ParallelSource:
    """The parallel-text source of the `data` section; a missing directory or file of `splits` fails here,
    named, before any work."""
    options = dict(data.options)
    if data.source in SOURCES_WITH_DIRECTORY:
        if not data.path:
            default = MULTI30K_SPLIT_PREFIXES if data.source == "multi30k" else {split: split for split in SPLITS}
            langs = (data.source_lang, data.target_lang)
            files = ", ".join(
                f"{prefix}.{langs[0]} / .{langs[1]}" for prefix in options.get("split_prefixes", default).values()
            )
            named = " (the names of the Multi30k task 1 release)" if data.source == "multi30k" else ""
            raise ConfigError(
                f"data.source={data.source!r} reads sentence pairs from files in a directory: --config.data.path=DIR, "
                f"where DIR holds {files}{named}, one sentence a line, optionally gzipped (.gz)."
            )
        if not Path(data.path).is_dir():
            raise ConfigError(f"data.path={data.path!r} is not a directory.")
        options.setdefault("directory", data.path)
    if data.source == "tfds" and data.path:
        options.setdefault("data_dir", data.path)
    if data.source != "builtin":
        options.setdefault("source_lang", data.source_lang)
        options.setdefault("target_lang", data.target_lang)
    try:
        source = make_source(data.source, **options)
    except TypeError as error:  # an unknown or misspelt name in data.options
        raise ConfigError(f"data.options: {error}") from None
    if isinstance(source, LocalFilesSource):
        for split in splits:
            for lang in (source.source_lang, source.target_lang):
                source.path(split, lang)
    return source


def check_splits_not_empty(source: ParallelSource, splits: tuple[str, ...] = ("train", "validation")) -> None:
    """Training needs a pair in 'train' (the tokenizer learns from it) and in 'validation'; checked before any work."""
    for split in splits:
        if next(iter(source.pairs(split)), None) is None:
            raise ConfigError(
                f"the {split} split of data.source={source.__class__.__name__} has no sentence pairs "
                f"(empty files, or every pair skipped as empty or too long); check data.path / "
                f"data.source."
            )
