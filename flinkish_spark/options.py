"""Typed, validated reading of Spark-style string options.

Spark passes options as a case-insensitive string map. :class:`Options` reads
them with one clear :class:`~flinkish_spark.errors.ConfigError` per bad value
(naming the option, the value and what is expected) and rejects options the
component does not know, suggesting the closest known name.
"""

from __future__ import annotations

import difflib
from typing import Iterable, Mapping, TypeVar

from flinkish_spark.errors import ConfigError

E = TypeVar("E", bound=str)

# Accepted by every component that touches storage.
STORAGE_OPTIONS = ("endpointUrl", "region", "storageOptions")


class Options:
    def __init__(self, raw: Mapping[str, str], component: str, known: Iterable[str]) -> None:
        self.component = component
        self._raw = {str(k).lower(): str(v) for k, v in raw.items()}
        self._known = {k.lower(): k for k in known}
        unknown = sorted(k for k in self._raw if k not in self._known)
        if unknown:
            name = unknown[0]
            close = difflib.get_close_matches(name, list(self._known), n=1)
            hint = f" Did you mean '{self._known[close[0]]}'?" if close else ""
            raise ConfigError(
                f"{component}: unknown option '{name}'.{hint} Known options: "
                + ", ".join(sorted(self._known.values()))
            )

    def raw(self) -> dict[str, str]:
        """The options under their canonical (camelCase) names."""
        return {self._known[k]: v for k, v in self._raw.items()}

    def has(self, name: str) -> bool:
        return name.lower() in self._raw

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._raw.get(name.lower(), default)

    def required(self, name: str, hint: str) -> str:
        value = self._raw.get(name.lower())
        if value is None or not value.strip():
            raise ConfigError(f"{self.component}: option '{name}' is required: {hint}")
        return value.strip()

    def integer(self, name: str, default: int | None = None, minimum: int = 0) -> int | None:
        value = self._raw.get(name.lower())
        if value is None or value.strip() == "":
            return default
        try:
            number = int(value.strip())
        except ValueError:
            raise ConfigError(
                f"{self.component}: option '{name}' must be a whole number, got {value!r}"
            ) from None
        if number < minimum:
            raise ConfigError(
                f"{self.component}: option '{name}' must be >= {minimum}, got {number}"
            )
        return number

    def number(self, name: str, default: float | None = None) -> float | None:
        value = self._raw.get(name.lower())
        if value is None or value.strip() == "":
            return default
        try:
            number = float(value.strip())
        except ValueError:
            raise ConfigError(f"{self.component}: option '{name}' must be a number, got {value!r}") from None
        if not number > 0:
            raise ConfigError(f"{self.component}: option '{name}' must be > 0, got {value!r}")
        return number

    def boolean(self, name: str, default: bool) -> bool:
        value = self._raw.get(name.lower())
        if value is None:
            return default
        v = value.strip().lower()
        if v in ("true", "1", "yes"):
            return True
        if v in ("false", "0", "no"):
            return False
        raise ConfigError(f"{self.component}: option '{name}' must be true or false, got {value!r}")

    def choice(self, name: str, choices: tuple[E, ...], default: E) -> E:
        value = self._raw.get(name.lower())
        if value is None:
            return default
        v = value.strip().lower()
        for c in choices:
            if c.lower() == v:
                return c
        raise ConfigError(
            f"{self.component}: option '{name}' must be one of {', '.join(choices)}, got {value!r}"
        )
