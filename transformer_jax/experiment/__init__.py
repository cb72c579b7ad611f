"""The experiment: one typed tree of frozen sections, built once at the edge, and where it comes from.

    Experiment(model, data, optimizer, train, decode, mesh, distributed)       tree.py
    data / optimizer / train / mesh / distributed sections                      sections.py
    (model: config.ModelConfig; decode: decoding.config.DecodeConfig)
    experiments/*.py `get_config()` or a workdir's config.json                 files.py
    `--config.section.field=value`, parsed by the field's declared type        overrides.py
    a config.json of an older version in today's layout                        migration.py

Every section validates itself when it is made and names the field and the fix, so a bad value fails before any
work. A new option is one field in its section plus the code that reads it: decode options become flags of
`translate` / `evaluate` from DecodeConfig's field metadata, every field is a `--config.` override.
"""

from transformer_jax.decoding.config import DecodeConfig
from transformer_jax.errors import ConfigError
from transformer_jax.experiment.files import exec_python_file, load_config_file, load_experiment
from transformer_jax.experiment.migration import upgrade_config
from transformer_jax.experiment.overrides import apply_overrides
from transformer_jax.experiment.sections import (
    DROPOUT_PRNGS,
    SOURCES_WITH_DIRECTORY,
    TOKENIZER_NORMALIZATIONS,
    DataConfig,
    DistributedConfig,
    MeshConfig,
    OptimizerConfig,
    TrainConfig,
)
from transformer_jax.experiment.tree import SECTIONS, TOKENIZER_FIELDS, Experiment

__all__ = [
    "DROPOUT_PRNGS",
    "SECTIONS",
    "SOURCES_WITH_DIRECTORY",
    "TOKENIZER_FIELDS",
    "TOKENIZER_NORMALIZATIONS",
    "ConfigError",
    "DataConfig",
    "DecodeConfig",
    "DistributedConfig",
    "Experiment",
    "MeshConfig",
    "OptimizerConfig",
    "TrainConfig",
    "apply_overrides",
    "exec_python_file",
    "load_config_file",
    "load_experiment",
    "upgrade_config",
]
