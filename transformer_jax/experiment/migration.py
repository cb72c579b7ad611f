"""The one migration of saved configs: a workdir's config.json of any version in today's layout."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from transformer_jax.experiment.sections import OptimizerConfig
from transformer_jax.experiment.tree import Experiment


def upgrade_config(values: Mapping[str, Any]) -> dict:
    """A config.json of any version in today's layout, so that older workdirs still replay and resume: version 0.1's
    one `train` section with the Adam fields and its model `preset` name, and a field added since is filled in with
    its default (a new field's default is what ran before it existed, e.g. key_dim None: d_model / num_heads)."""
    values = {name: dict(section) for name, section in values.items()}
    if "model" in values:
        values["model"].pop("preset", None)
    train = values.get("train", {})
    moved = {name: train.pop(name) for name in [f.name for f in dataclasses.fields(OptimizerConfig)] if name in train}
    if moved:
        values["optimizer"] = {**moved, **values.get("optimizer", {})}
    for name, defaults in Experiment().to_dict().items():
        if name in values:
            values[name] = {**defaults, **values[name]}
    return values
