"""`--config.section.field=value` overrides, each parsed by the field's declared type."""

from __future__ import annotations

import ast
import dataclasses
import types
import typing
from collections.abc import Iterable
from typing import Any, Literal

from transformer_jax.errors import ConfigError
from transformer_jax.experiment.tree import SECTIONS, TOKENIZER_FIELDS, Experiment, build_section


def apply_overrides(experiment: Experiment, overrides: Iterable[tuple[str, str]]) -> Experiment:
    """A new Experiment with ('train.steps', '100') pairs applied, each parsed by the field's declared type.

    Unknown fields are errors that list the known ones; `data.options.NAME` takes any name (an option of the
    source). The values are checked once all are in, by the sections as they are rebuilt and by the Experiment,
    so the order of the overrides does not matter (`model.attention_impl=cudnn model.dtype=bfloat16`).
    """
    changes: dict[str, dict[str, Any]] = {}  # section name -> field -> new value
    for dotted, text in overrides:
        section_name, _, name = dotted.partition(".")
        if section_name not in SECTIONS or not name:
            raise ConfigError(f"--config.{dotted}: no section {section_name!r}; known: {sorted(SECTIONS)}.")
        section = getattr(experiment, section_name)
        fields = changes.setdefault(section_name, {})
        if dotted.startswith("data.options."):
            option = dotted.removeprefix("data.options.")
            fields["options"] = {**fields.get("options", section.options), option: _parse(text, Any, dotted)}
            continue
        known = sorted(field.name for field in dataclasses.fields(section))
        if name not in known:
            raise ConfigError(f"--config.{dotted}: unknown field {name!r}; known fields of {section_name}: {known}.")
        if section_name == "model" and name in TOKENIZER_FIELDS:
            raise ConfigError(
                f"--config.{dotted}: vocab_size and the special ids come from the SentencePiece "
                f"model; set data.vocab_size."
            )
        fields[name] = _parse(text, typing.get_type_hints(type(section))[name], dotted)
    rebuilt = {
        name: build_section(type(getattr(experiment, name)), name, {**_fields(getattr(experiment, name)), **fields})
        for name, fields in changes.items()
    }
    return experiment.replace(**rebuilt)  # cross-section checks raise ConfigError


def _fields(section) -> dict[str, Any]:
    return {field.name: getattr(section, field.name) for field in dataclasses.fields(section)}


def _parse(text: str, hint: Any, dotted: str) -> Any:
    """The value of `--config.{dotted}={text}` for a field annotated `hint`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [arg for arg in args if arg is not type(None)]
        if text.strip().lower() in ("none", "null") and len(options) < len(args):
            return None
        return _parse(text, options[0], dotted)
    if origin is Literal or hint is str:
        return text
    if hint is bool:
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"--config.{dotted}={text!r}: expected true or false.")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        if hint is Any:  # e.g. model.dtype=bfloat16
            return text
        raise ConfigError(f"--config.{dotted}={text!r}: expected {_type_name(hint)}.") from None
    if hint is Any:
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if origin is tuple:
        return tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not isinstance(value, origin or hint) or (isinstance(value, bool) and hint is not bool):
        raise ConfigError(f"--config.{dotted}={text!r}: expected {_type_name(hint)}, got {type(value).__name__}.")
    return value


def _type_name(hint: Any) -> str:
    name = getattr(typing.get_origin(hint) or hint, "__name__", str(hint))
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"
