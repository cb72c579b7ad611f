"""Experiment: the whole configuration of a run, one typed tree of frozen sections, and its JSON form.

Experiment(model, data, optimizer, train, decode, mesh, distributed)
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Mapping
from typing import Any

from transformer_jax.config import ModelConfig
from transformer_jax.decoding.config import DecodeConfig
from transformer_jax.errors import ConfigError
from transformer_jax.experiment.sections import DataConfig, DistributedConfig, MeshConfig, OptimizerConfig, TrainConfig

# ModelConfig fields that the tokenizer decides (data.vocab_size; the special ids of data/tokenizer.py).
TOKENIZER_FIELDS = ("vocab_size", "pad_id", "bos_id", "eos_id")


@dataclasses.dataclass(frozen=True)
class Experiment:
    """The whole configuration of a run. `model.vocab_size` always equals `data.vocab_size`."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)

    def __post_init__(self):
        if self.model.vocab_size != self.data.vocab_size:
            try:
                object.__setattr__(self, "model", self.model.replace(vocab_size=self.data.vocab_size))
            except ValueError as error:
                raise ConfigError(f"data.vocab_size={self.data.vocab_size}: {error}") from None
        if self.data.max_len > self.model.max_len:
            raise ConfigError(
                f"data.max_len={self.data.max_len} exceeds the model's max_len={self.model.max_len} "
                f"(positions table); raise --config.model.max_len or lower data.max_len."
            )

    def replace(self, **changes) -> Experiment:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """JSON-able: tuples as lists, dtypes by name."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Experiment:
        """From `to_dict()` output (a workdir's config.json, `workdir.load_config`); sections left out keep their
        defaults."""
        unknown = sorted(set(values) - set(SECTIONS))
        if unknown:
            raise ConfigError(f"unknown config sections {unknown}; known: {sorted(SECTIONS)}.")
        sections = {}
        for name, fields in values.items():
            section_cls = SECTIONS[name]
            known = {field.name for field in dataclasses.fields(section_cls)}
            if set(fields) - known:
                raise ConfigError(
                    f"unknown fields {sorted(set(fields) - known)} in section {name!r}; known: {sorted(known)}."
                )
            sections[name] = build_section(section_cls, name, {key: _as_tuples(value) for key, value in fields.items()})
        return cls(**sections)


SECTIONS: dict[str, type] = typing.get_type_hints(Experiment)  # section name -> its dataclass


def build_section(section_cls: type, name: str, fields: Mapping[str, Any]):
    """section_cls(**fields), its ValueErrors (ModelConfig's) as ConfigErrors naming the section."""
    try:
        return section_cls(**fields)
    except ConfigError:
        raise
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{name} section: {error}") from None


def _as_tuples(value: Any) -> Any:
    """JSON has lists where the config holds tuples (bucket_boundaries, ...)."""
    if isinstance(value, list):
        return tuple(_as_tuples(item) for item in value)
    if isinstance(value, dict):
        return {key: _as_tuples(item) for key, item in value.items()}
    return value
