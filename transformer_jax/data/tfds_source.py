"""Pairs from a tensorflow-datasets translation dataset; by default WMT 2014 English→German (paper §5.1).

Reads with `tfds.data_source` (random-access ArrayRecord files, no TensorFlow needed at read time). The
dataset must be prepared in ArrayRecord format under `data_dir`, once, e.g.
`tfds build wmt14_translate/de-en --file_format=array_record --data_dir=...` (preparing needs network
access and TensorFlow; `download=True` does it from here). tfds stores wmt14 'de-en' with German first;
the direction here is set only by `source_lang` / `target_lang`, the feature keys of each example.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from transformer_jax.data.pairs import Pair, SkipCounts, check_split, filter_pairs

WMT14_EN_DE = "wmt14_translate/de-en"


def _text(value: str | bytes) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


@dataclasses.dataclass
class TfdsSource:
    """Pairs `(example[source_lang], example[target_lang])` of the tfds dataset `name`."""

    name: str = WMT14_EN_DE
    source_lang: str = "en"
    target_lang: str = "de"
    data_dir: str | None = None
    download: bool = False
    max_chars: int | None = None
    skipped: dict[str, SkipCounts] = dataclasses.field(default_factory=dict, init=False)

    def pairs(self, split: str) -> Iterator[Pair]:
        check_split(split)
        try:
            import tensorflow_datasets as tfds  # heavy: imported only when this source is read
            import tensorflow_datasets.translate  # noqa: F401  registers wmt14 when TensorFlow is absent
        except ImportError as error:
            raise ImportError("TfdsSource needs tensorflow-datasets: pip install tensorflow-datasets.") from error
        try:
            examples = tfds.data_source(
                self.name,
                split=split,
                data_dir=self.data_dir,
                download=self.download,
                builder_kwargs={"file_format": "array_record"},
            )
        except Exception as error:  # noqa: BLE001 - tfds raises several types for a dataset that is not there
            where = self.data_dir or "~/tensorflow_datasets"
            raise FileNotFoundError(
                f"{self.name} split {split!r} is not prepared under {where} ({type(error).__name__}). Prepare it "
                f"once (needs the network and TensorFlow): pip install tensorflow tensorflow-datasets; "
                f"tfds build {self.name} --file_format=array_record --data_dir=DIR; then pass "
                f"--config.data.path=DIR."
            ) from None
        counts = self.skipped[split] = SkipCounts()
        yield from filter_pairs(self._select(examples), self.max_chars, counts, f"{self.name} {split}")

    def _select(self, examples) -> Iterator[Pair]:
        for example in examples:
            if self.source_lang not in example or self.target_lang not in example:
                raise KeyError(
                    f"{self.name} examples have the keys {sorted(example)}, not both "
                    f"source_lang={self.source_lang!r} and target_lang={self.target_lang!r}."
                )
            yield _text(example[self.source_lang]), _text(example[self.target_lang])
