"""A backend factory's settings from environment variables (``GUARDED_PG_*``, ``GUARDED_REDIS_*``):
text, durations, integers and flags read alike by every backend, each error naming its variable."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .durations import DURATION_EXAMPLES, parse_duration

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})


class ConfigurationError(ValueError):
    """An environment variable has a value the factory cannot use; the message names it."""


@dataclass(frozen=True, slots=True)
class EnvSettings:
    """The variables of ``env`` whose names start with ``prefix`` (``GUARDED_REDIS_``)."""

    env: Mapping[str, str]
    prefix: str

    def text(self, name: str) -> str | None:
        """The stripped value of ``prefix + name``; ``None`` when unset or blank."""
        value = self.env.get(self.prefix + name)
        return value.strip() if value is not None and value.strip() else None

    def duration(self, name: str, default: float | None, *, nullable: bool = False) -> float | None:
        """Seconds (``30s``, ``15m``, a plain number of seconds); ``default`` when unset; ``none``
        is ``None`` when ``nullable``."""
        raw = self.text(name)
        if raw is None:
            return default
        if nullable and raw.lower() == "none":
            return None
        try:
            return parse_duration(raw)
        except ValueError as exc:
            raise ConfigurationError(
                f"{self.prefix}{name}={raw!r}: {exc}; write a duration such as {DURATION_EXAMPLES} "
                "(a plain number is seconds)"
            ) from None

    def integer(self, name: str, default: int) -> int:
        """A whole number; ``default`` when unset."""
        found = self.optional_integer(name)
        return default if found is None else found

    def optional_integer(self, name: str) -> int | None:
        """A whole number; ``None`` when unset."""
        raw = self.text(name)
        if raw is None:
            return None
        try:
            return int(raw)
        except ValueError:
            raise ConfigurationError(f"{self.prefix}{name}={raw!r} is not an integer") from None

    def flag(self, name: str, default: bool) -> bool:
        """``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``; ``default`` when unset."""
        raw = self.text(name)
        if raw is None:
            return default
        if raw.lower() in TRUE_WORDS:
            return True
        if raw.lower() in FALSE_WORDS:
            return False
        raise ConfigurationError(f"{self.prefix}{name}={raw!r} must be 1/0, true/false, yes/no or on/off")


__all__ = ["FALSE_WORDS", "TRUE_WORDS", "ConfigurationError", "EnvSettings"]
