"""The base of a config section (the experiment's `data`, `train`, ... and decoding's `decode`): a frozen dataclass
that checks itself when it is made, so a bad value fails before any work and names the field and the fix."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar, Literal

from transformer_jax.errors import ConfigError


def positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


class Section:
    """Literal fields hold one of their choices; `_positive` names positive-int fields; `_validate` adds the rest."""

    section: ClassVar[str]
    _positive: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            value, hint = getattr(self, field.name), hints[field.name]
            if typing.get_origin(hint) is Literal and value not in typing.get_args(hint):
                raise ConfigError(
                    f"{self.section}.{field.name}={value!r} is unknown; use one of {typing.get_args(hint)}."
                )
        for name in self._positive:
            if not positive_int(getattr(self, name)):
                raise ConfigError(f"{self.section}.{name}={getattr(self, name)!r} must be a positive integer.")
        self._validate()

    def _validate(self) -> None:
        """Checks beyond choices and positive integers."""

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)
