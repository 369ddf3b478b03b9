"""``GUARDED_*`` environment variables as settings of :class:`~guarded.config.GuardConfig`
(docs/configuration.md has the table).

Every field is a variable, sections nested with ``__`` (``GUARDED_TIMEOUT__DEADLINE=0.3``,
``GUARDED_METHODS__LOAD_HISTORY__DEADLINE=1``), and so is each flat shorthand
(``GUARDED_TIMEOUT=0.3``, ``GUARDED_RETRIES=3``, ``GUARDED_SPILL_PATH=none``, ``GUARDED_BATCHING=0``,
``GUARDED_BREAKER=false``). pydantic-settings reads and parses them (nested names, JSON for a whole
section, ``none`` for ``None``, the booleans pydantic accepts) with the very field types of the
configuration, so a variable means exactly what the same argument does. The environment is read
each time a ``GuardConfig`` is validated (``GuardConfig()``, ``guard()`` without ``config``), never
at import.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Optional

from pydantic import ValidationError, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict

from .config import (
    SHORTHANDS,
    BatchConfig,
    BreakerConfig,
    GuardConfig,
    MethodConfig,
    TimeoutConfig,
    UnknownSettingError,
    closest,
    expand_shorthands,
    sections,
)

PREFIX = "GUARDED_"
DELIMITER = "__"

FOREIGN = frozenset({"dlq_path", "metrics_target", "differential_seed", "factory"})
"""``GUARDED_*`` variables read elsewhere (``GUARDED_DLQ_PATH`` by the default of
``dead_letter.path``, the others by tools and tests); ``GUARDED_PG_*`` are the PostgreSQL store's."""

_SHORTHAND_TYPES: dict[str, Any] = {
    "timeout": TimeoutConfig | float | None,
    "batching": BatchConfig | bool | None,
    "breaker": BreakerConfig | bool | None,
}


@functools.cache
def _settings_model() -> type[BaseSettings]:
    """A settings class with GuardConfig's fields (each optional) and the shorthands, built once
    from GuardConfig so that a field added there is a variable too."""
    fields: dict[str, Any] = {
        name: (_SHORTHAND_TYPES.get(name, Optional[field.annotation]), None)  # noqa: UP045
        for name, field in GuardConfig.model_fields.items()
    }
    fields["retries"] = (int | None, None)
    fields["spill_path"] = (str | None, None)

    class _Base(BaseSettings):
        model_config = SettingsConfigDict(
            env_prefix=PREFIX,
            env_nested_delimiter=DELIMITER,
            case_sensitive=False,
            extra="ignore",
            env_parse_none_str="none",
            env_ignore_empty=True,  # GUARDED_STRICT= (set, empty) means unset, as in a shell
            hide_input_in_errors=True,
        )

    model: type[BaseSettings] = create_model("GuardedEnvironment", __base__=_Base, **fields)
    return model


def _variable(*parts: str) -> str:
    return PREFIX + DELIMITER.join(parts).upper()


def _unknown(name: str, suggestion: str | None, valid: str = "") -> UnknownSettingError:
    hint = f" (did you mean {suggestion}?)" if suggestion else ""
    return UnknownSettingError(f"{name} is not a guarded setting{hint}{'; ' + valid if valid else ''}")


def _is_setting(name: str) -> bool:
    """Whether ``name`` (a ``GUARDED_*`` variable) is a setting. A variable that is evidently a
    misspelled setting raises :class:`UnknownSettingError` naming the closest valid variable; one
    that belongs to something else (``GUARDED_PG_*``, ``GUARDED_DLQ_PATH``, ...) is ``False``."""
    head, *rest = name[len(PREFIX) :].lower().split(DELIMITER)
    nested = sections()
    top = [*GuardConfig.model_fields, *SHORTHANDS]
    if head not in top:
        if head in FOREIGN or head.startswith("pg_"):
            return False
        for title, model in nested.items():  # GUARDED_RETRY_MAX_ATTEMPTS: one underscore for two
            field = head[len(title) + 1 :]
            if head.startswith(title + "_") and field in model.model_fields:
                raise _unknown(name, _variable(title, field, *rest))
        found = closest(head, top, cutoff=0.8)
        if found is not None:
            raise _unknown(name, _variable(found, *rest))
        return False
    if not rest:
        return True
    if head == "methods":
        if len(rest) == 2 and rest[1] in MethodConfig.model_fields:
            return True
        found = closest(rest[-1], MethodConfig.model_fields) if len(rest) == 2 else None
        fields = ", ".join(field.upper() for field in MethodConfig.model_fields)
        raise _unknown(
            name,
            _variable(head, rest[0], found) if found else None,
            f"a method's setting is GUARDED_METHODS__<METHOD>__<FIELD>, <FIELD> one of {fields}",
        )
    section = nested.get(head)
    if section is None:
        raise _unknown(name, _variable(head), f"{_variable(head)} takes one value, it has no fields")
    if len(rest) == 1 and rest[0] in section.model_fields:
        return True
    found = closest(rest[0], section.model_fields)
    valid = ", ".join(_variable(head, field) for field in section.model_fields)
    raise _unknown(name, _variable(head, found) if found else None, f"{head} has {valid}")


def _refused(error: ValidationError) -> ValueError:
    """A value pydantic refused, said with the variable that carried it."""
    found: list[tuple[list[str], str]] = []
    for item in error.errors():
        # The location without the union members' tags ("function-after[...]", "float").
        path = [str(part) for part in item["loc"] if _NAME.fullmatch(str(part)) and str(part) not in _TAGS]
        message = item["msg"].removeprefix("Value error, ")
        found.append((path, message))
    lines: list[str] = []
    for path, message in found:
        line = message
        if not _own_check(message):
            if len(path) == 1 and path[0] in SHORTHANDS:
                if any(len(other) > 1 and other[0] == path[0] for other, _ in found):
                    continue  # a field of the section was refused: the shorthand reading is noise
                if any(_own_check(other) for _, other in found):
                    continue  # the section was refused by its own check, which says why
                message = f"takes {SHORTHANDS[path[0]]}, or a JSON object of its fields"
            variable = _variable(*path)
            value = next((v for k, v in os.environ.items() if k.upper() == variable), None)
            line = f"{variable}{f'={value!r}' if value is not None else ''}: {message}"
        if line not in lines:
            lines.append(line)
    return ValueError("; ".join(lines))


def _own_check(message: str) -> bool:
    """A refusal of this package's own checks, which names its settings itself."""
    return message.startswith(("timeout.", "bulkhead.", "retries=", "timeout=", "spill_path="))


_NAME = re.compile(r"[a-z_][a-z0-9_]*")
_TAGS = frozenset({"float", "bool", "int", "str", "none"})


def environment_settings() -> dict[str, Any]:
    """The settings the ``GUARDED_*`` variables give now, shorthands expanded (empty when none is
    set). Raises :class:`UnknownSettingError` for a misspelled variable, ``ValueError`` for a
    value its setting does not take."""
    if not any(_is_setting(name) for name in list(os.environ) if name.upper().startswith(PREFIX)):
        return {}
    given = {name.upper() for name in os.environ}
    for name in SHORTHANDS:
        whole = _variable(name)
        if whole in given and any(other.startswith(whole + DELIMITER) for other in given):
            raise ValueError(f"{whole} and {whole}{DELIMITER}<FIELD> are both set: set one or the other")
    try:
        settings = _settings_model()()
    except ValidationError as error:
        raise _refused(error) from None
    return expand_shorthands(settings.model_dump(exclude_unset=True))
