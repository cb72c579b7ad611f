"""Where an experiment comes from: an experiments/*.py file's `get_config()` or a workdir's config.json, with
`--config.section.field=value` overrides.

    experiment = load_experiment("experiments/tiny.py", [("train.steps", "100")])
"""

from __future__ import annotations

import importlib.util
import json
import types
from collections.abc import Iterable
from pathlib import Path

from transformer_jax.errors import ConfigError
from transformer_jax.experiment.migration import upgrade_config
from transformer_jax.experiment.overrides import apply_overrides
from transformer_jax.experiment.tree import Experiment


def load_experiment(path: str | Path, overrides: Iterable[tuple[str, str]] = ()) -> Experiment:
    """`load_config_file(path)` with ('section.field', 'text') overrides applied."""
    return apply_overrides(load_config_file(path), overrides)


def load_config_file(path: str | Path) -> Experiment:
    """The Experiment of a Python file's `get_config()`, or of a workdir's config.json (replays that run)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} not found; e.g. --config experiments/tiny.py")
    if path.suffix == ".json":
        try:
            return Experiment.from_dict(upgrade_config(json.loads(path.read_text())))
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path} is not valid JSON ({error}).") from None
    module = exec_python_file(path, "_experiment_")
    if module is None:
        raise ConfigError(f"{path} is not a Python file; give an experiments/*.py file or a workdir's config.json.")
    try:
        experiment = module.get_config() if hasattr(module, "get_config") else None
    except ValueError as error:  # a section's ConfigError, or ModelConfig's ValueError
        raise ConfigError(f"{path}: {error}") from None
    if not isinstance(experiment, Experiment):
        raise ConfigError(f"{path} must define get_config() returning a transformer_jax.experiment.Experiment.")
    return experiment


def exec_python_file(path: Path, prefix: str) -> types.ModuleType | None:
    """The executed module of a user's Python file (an experiment or sweep file), None if it is not Python source.
    A syntax error in it is a ConfigError naming the file, line and text."""
    spec = importlib.util.spec_from_file_location(f"{prefix}{path.stem}", path)
    if spec is None or spec.loader is None or path.suffix != ".py":
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        raise ConfigError(
            f"{path}, line {error.lineno}: {error.msg}: {(error.text or '').strip()!r}; fix the file and run again."
        ) from None
    return module
