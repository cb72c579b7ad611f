"""`make_source(kind, **options)`: one entry point to every parallel-text source, for configs and the CLI.

Every source yields (source text, target text) pairs by split: 'train', 'validation', 'test'.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from transformer_jax.data.builtin_corpus import BuiltinCorpusSource
from transformer_jax.data.local_files import MULTI30K_SPLIT_PREFIXES, LocalFilesSource
from transformer_jax.data.pairs import ParallelSource
from transformer_jax.data.tfds_source import TfdsSource

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
        fields = [field.name for field in dataclasses.fields(cls) if field.init]
        raise TypeError(f"Bad options for source {kind!r} ({error}); it takes {fields}.") from error
