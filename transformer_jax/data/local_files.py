"""Parallel text in local files: `{directory}/{prefix}.{lang}`, one sentence a line, optionally `.gz`.

Line i of the source file translates line i of the target file. Each side is stripped of surrounding
whitespace; pairs with an empty side are skipped, as are pairs with a side longer than `max_chars`
characters; both are counted in `source.skipped[split]` and logged. A file that is missing, not UTF-8, or
has a different number of lines than its partner is an error that names the file.
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO

from transformer_jax.data.pairs import SPLITS, Pair, SkipCounts, check_split, filter_pairs
from transformer_jax.errors import DataError

# Multi30k task 1 (Elliott et al. 2016) names its splits train / val / test_2016_flickr.
MULTI30K_SPLIT_PREFIXES = {"train": "train", "validation": "val", "test": "test_2016_flickr"}


def _open_binary(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # type: ignore[return-value]


def _count_lines(path: Path) -> int:
    with _open_binary(path) as file:
        return sum(1 for _ in file)


def read_lines(path: Path) -> Iterator[str]:
    """Yields the lines of a UTF-8 text file (gzipped if it ends in .gz) without their line ends."""
    with _open_binary(path) as file:
        for line_number, raw in enumerate(file, start=1):
            try:
                yield raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as error:
                raise DataError(
                    f"{path}, line {line_number}: not valid UTF-8 ({error.reason} at byte {error.start} "
                    f"of the line). Re-encode the file as UTF-8, e.g. `iconv -f LATIN1 -t UTF-8 {path.name} > "
                    f"{path.name}.utf8` (-f names its real encoding)."
                ) from error


@dataclasses.dataclass
class LocalFilesSource:
    """Pairs from `{directory}/{split_prefixes[split]}.{source_lang}` and `....{target_lang}`."""

    directory: str | Path
    source_lang: str = "en"
    target_lang: str = "de"
    split_prefixes: Mapping[str, str] = dataclasses.field(default_factory=lambda: {split: split for split in SPLITS})
    max_chars: int | None = 1000
    skipped: dict[str, SkipCounts] = dataclasses.field(default_factory=dict, init=False)

    def path(self, split: str, lang: str) -> Path:
        """The file holding the `lang` side of `split`: `{prefix}.{lang}`, else `{prefix}.{lang}.gz`."""
        check_split(split)
        if split not in self.split_prefixes:
            raise ValueError(f"No file prefix for split {split!r}; split_prefixes={dict(self.split_prefixes)}.")
        stem = Path(self.directory) / f"{self.split_prefixes[split]}.{lang}"
        for candidate in (stem, stem.with_name(stem.name + ".gz")):
            if candidate.is_file():
                return candidate
        present = sorted(p.name for p in Path(self.directory).glob("*")) if Path(self.directory).is_dir() else []
        raise FileNotFoundError(
            f"Missing the {lang!r} side of split {split!r}: expected the file {stem} (or {stem}.gz), "
            f"one sentence a line. Files in {self.directory}: {present or 'none (no such directory?)'}."
        )

    def pairs(self, split: str) -> Iterator[Pair]:
        source_path = self.path(split, self.source_lang)
        target_path = self.path(split, self.target_lang)
        counts = self.skipped[split] = SkipCounts()
        name = f"{source_path} + {target_path}"
        yield from filter_pairs(self._zip_lines(source_path, target_path), self.max_chars, counts, name)

    @staticmethod
    def _zip_lines(source_path: Path, target_path: Path) -> Iterator[Pair]:
        lines = itertools.zip_longest(read_lines(source_path), read_lines(target_path))
        for source, target in lines:
            if source is None or target is None:
                raise DataError(
                    f"Line counts differ: {source_path} has {_count_lines(source_path)} lines but "
                    f"{target_path} has {_count_lines(target_path)}; line i of one must translate line i "
                    f"of the other."
                )
            yield source, target
