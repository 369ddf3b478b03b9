"""Steering payload sanitization and validation (spec 000, "Steering Payload Sanitization").

Steering payloads are untrusted user input. :func:`sanitize_payload` and
:func:`sanitize_steering_event` clamp them exactly as PenguiFlow 3.11's ``penguiflow.steering``
does (PenguiFlow's reference ``InMemoryStateStore.save_steering`` stores what they return), with
one deliberate difference: the result is always *strict*, storable JSON. Non-finite floats become
their string form (``"nan"``, ``"inf"``), lone surrogates become U+FFFD and integers too large to
write as JSON become a description, where PenguiFlow keeps values that PostgreSQL's ``json`` type
cannot hold (or raises ``UnicodeEncodeError``, losing the event). **Sanitization is lossy by
design**: what it drops or rewrites cannot be recovered, so stores persist the sanitized form,
never the raw input.

Stores sanitize and store; they do not validate. PenguiFlow validates in its sessions, *before*
calling ``save_steering``, and stores what it is given (including events its own sessions create
without validation, such as propagated cancellations): a store that refused more than
PenguiFlow's reference would lose steering events. :func:`validate_steering_event` checks
PenguiFlow's event-specific rules (the spec's table) for callers that want to validate, and
raises :class:`~guarded.errors.SteeringValidationError` whose messages name the field, never a
value.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from itertools import islice
from typing import Any, TypeVar

from .errors import SteeringValidationError

MAX_STEERING_PAYLOAD_BYTES = 16_384
"""Largest UTF-8 size of the JSON-encoded sanitized payload; larger ones become a summary."""
MAX_STEERING_DEPTH = 6
"""Nesting levels kept; values below them become ``"<truncated>"``."""
MAX_STEERING_KEYS = 64
"""Keys kept per mapping; more add ``"__truncated_keys__": true``."""
MAX_STEERING_LIST_ITEMS = 50
"""Items kept per list, tuple or set; more add a final ``"<truncated>"`` item."""
MAX_STEERING_STRING = 4_096
"""Characters kept per string."""

TRUNCATED = "<truncated>"
TRUNCATED_KEYS = "__truncated_keys__"
_MAX_KEY_CHARS = 64
_MAX_INT_BITS = 12_000
"""Larger integers are replaced by a description; their decimal form would exceed the string limit."""

E = TypeVar("E")


def _text(value: str, limit: int = MAX_STEERING_STRING) -> str:
    """``value`` as a plain str of at most ``limit`` characters with lone surrogates replaced by U+FFFD."""
    text = str.__str__(value)[:limit]
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def _describe(value: object) -> str:
    try:
        return _text(str(value))
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _key(key: object) -> str:
    return _text(key if isinstance(key, str) else _describe(key), _MAX_KEY_CHARS)


def _sanitize_value(value: Any, depth: int) -> Any:
    """PenguiFlow 3.11's ``_sanitize_value`` with strict-JSON scalars (see the module docstring)."""
    if depth <= 0:
        return TRUNCATED
    if isinstance(value, str):
        return _text(value)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if value.bit_length() <= _MAX_INT_BITS else f"<integer of {value.bit_length()} bits>"
    if isinstance(value, float):
        return value if math.isfinite(value) else str(float(value))
    if isinstance(value, dict):
        result: dict[str, Any] = {}
        for index, (key, item) in enumerate(value.items()):
            if index >= MAX_STEERING_KEYS:
                result[TRUNCATED_KEYS] = True
                break
            result[_key(key)] = _sanitize_value(item, depth - 1)
        return result
    if isinstance(value, list | tuple | set):
        items = [_sanitize_value(item, depth - 1) for item in islice(value, MAX_STEERING_LIST_ITEMS)]
        if len(value) > MAX_STEERING_LIST_ITEMS:
            items.append(TRUNCATED)
        return items
    return _describe(value)


def _json(payload: Mapping[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False)


def _fits(raw: str, max_payload_bytes: int) -> bool:
    return len(raw.encode("utf-8")) <= max_payload_bytes


def _summary(raw: str, max_payload_bytes: int = MAX_STEERING_PAYLOAD_BYTES) -> dict[str, Any]:
    """The spec's "truncated summary" fallback: the first characters of the JSON text, as
    PenguiFlow 3.11 -- but never over ``max_payload_bytes`` (PenguiFlow's 4,096 characters can
    reach 16,403 bytes when they are 4-byte characters): shortened further until it fits."""
    summary = raw[:MAX_STEERING_STRING]
    while summary:
        excess = len(_json({"truncated": True, "summary": summary}).encode("utf-8")) - max_payload_bytes
        if excess <= 0:
            break
        summary = summary[: max(0, len(summary) - max(1, excess // 4))]
    return {"truncated": True, "summary": summary}


def sanitize_payload(payload: Any, *, max_payload_bytes: int = MAX_STEERING_PAYLOAD_BYTES) -> dict[str, Any]:
    """Clamp an untrusted steering payload as PenguiFlow 3.11 does (spec 000 "Sanitization Process").

    Nesting deeper than :data:`MAX_STEERING_DEPTH` becomes ``"<truncated>"``, dicts keep
    :data:`MAX_STEERING_KEYS` keys (their keys as strings of at most 64 characters), lists, tuples
    and sets :data:`MAX_STEERING_LIST_ITEMS` items, strings :data:`MAX_STEERING_STRING`
    characters; any other value becomes its ``str()``. When the JSON text exceeds
    ``max_payload_bytes`` the result is ``{"truncated": true, "summary": <its first
    MAX_STEERING_STRING characters>}``. A non-dict payload is wrapped as ``{"value": ...}``.
    Unlike PenguiFlow the result is always strict JSON (see the module docstring). Lossy.
    """
    sanitized = _sanitize_value(payload, MAX_STEERING_DEPTH)
    if not isinstance(sanitized, dict):
        sanitized = {"value": sanitized}
    raw = _json(sanitized)
    return sanitized if _fits(raw, max_payload_bytes) else _summary(raw)


def sanitize_steering_event(event: E, *, max_payload_bytes: int = MAX_STEERING_PAYLOAD_BYTES) -> E:
    """Return a copy of ``event`` (ours or PenguiFlow's ``SteeringEvent``) with its payload sanitized.

    As ``penguiflow.steering.sanitize_steering_event``: the payload is sanitized with the default
    byte limit, and a result still larger than ``max_payload_bytes`` is summarised again. Uses
    ``model_copy`` when the event has it, so the copy keeps the event's class.
    """
    payload = sanitize_payload(dict(getattr(event, "payload", None) or {}))
    raw = _json(payload)
    if not _fits(raw, max_payload_bytes):
        payload = _summary(raw)
    model_copy = getattr(event, "model_copy", None)
    if callable(model_copy):
        copied: E = model_copy(update={"payload": payload})
        return copied
    if dataclasses.is_dataclass(event) and not isinstance(event, type):
        return dataclasses.replace(event, payload=payload)
    raise TypeError(f"cannot copy a {type(event).__qualname__}: expected a pydantic model or a dataclass")


def _non_empty_text(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _optional(payload: Mapping[str, Any], field: str, ok: Callable[[object], bool]) -> bool:
    return payload.get(field) is None or ok(payload[field])


def _inject_context(kind: str, payload: Mapping[str, Any]) -> list[str]:
    errors = []
    if not _non_empty_text(payload.get("text")):
        errors.append(f"{kind} requires non-empty 'text'")
    if not _optional(payload, "scope", lambda value: value in {"foreground", "task_only"}):
        errors.append(f"{kind} 'scope' must be 'foreground' or 'task_only'")
    if not _optional(payload, "severity", lambda value: value in {"note", "correction"}):
        errors.append(f"{kind} 'severity' must be 'note' or 'correction'")
    return errors


def _redirect(kind: str, payload: Mapping[str, Any]) -> list[str]:
    errors = []
    instruction = payload.get("instruction") or payload.get("goal") or payload.get("query")
    if not _non_empty_text(instruction):
        errors.append(f"{kind} requires non-empty 'instruction' (or 'goal'/'query')")
    if not _optional(payload, "constraints", lambda value: isinstance(value, Mapping)):
        errors.append(f"{kind} 'constraints' must be an object")
    return errors


def _cancel(kind: str, payload: Mapping[str, Any]) -> list[str]:
    errors = _reason(kind, payload)
    if not _optional(payload, "hard", lambda value: isinstance(value, bool)):
        errors.append(f"{kind} 'hard' must be a boolean")
    return errors


def _prioritize(kind: str, payload: Mapping[str, Any]) -> list[str]:
    # As PenguiFlow: a boolean is an int, so {"priority": True} is valid.
    if not isinstance(payload.get("priority"), int):
        return [f"{kind} requires integer 'priority'"]
    return []


def _decision(kind: str, payload: Mapping[str, Any]) -> list[str]:
    errors = []
    token = payload.get("resume_token") or payload.get("patch_id") or payload.get("event_id")
    if not isinstance(token, str) or not token:
        errors.append(f"{kind} requires non-empty 'resume_token' (or 'patch_id'/'event_id')")
    if not _optional(payload, "decision", lambda value: isinstance(value, str)):
        errors.append(f"{kind} 'decision' must be a string")
    return errors


def _reason(kind: str, payload: Mapping[str, Any]) -> list[str]:
    if not _optional(payload, "reason", lambda value: isinstance(value, str)):
        return [f"{kind} 'reason' must be a string"]
    return []


def _user_message(kind: str, payload: Mapping[str, Any]) -> list[str]:
    errors = []
    if not _non_empty_text(payload.get("text")):
        errors.append(f"{kind} requires non-empty 'text'")
    if not _optional(payload, "active_tasks", lambda value: isinstance(value, list)):
        errors.append(f"{kind} 'active_tasks' must be a list")
    return errors


_VALIDATORS: dict[str, Callable[[str, Mapping[str, Any]], list[str]]] = {
    "INJECT_CONTEXT": _inject_context,
    "REDIRECT": _redirect,
    "CANCEL": _cancel,
    "PRIORITIZE": _prioritize,
    "PAUSE": _reason,
    "RESUME": _reason,
    "APPROVE": _decision,
    "REJECT": _decision,
    "USER_MESSAGE": _user_message,
}


def validate_steering_event(event: Any) -> None:
    """Check the payload against the spec's "Event-Specific Payload Validation" table.

    The rules of ``penguiflow.steering.validate_steering_event`` (3.11), for callers that validate
    before saving as PenguiFlow's sessions do; the stores do not call it. Accepts our or
    PenguiFlow's ``SteeringEvent``. Raises
    :class:`~guarded.errors.SteeringValidationError` listing every problem, each naming its field
    (``"USER_MESSAGE requires non-empty 'text'"``).
    """
    payload = getattr(event, "payload", None)
    if not isinstance(payload, Mapping):
        raise SteeringValidationError(["payload must be an object"])
    event_type = getattr(event, "event_type", None)
    kind = str(getattr(event_type, "value", event_type))
    validator = _VALIDATORS.get(kind)
    if validator is None:
        # The unknown value is not repeated: messages never copy payload contents.
        raise SteeringValidationError(
            [f"unknown steering event_type (a {type(event_type).__name__}; known: {', '.join(_VALIDATORS)})"]
        )
    errors = validator(kind, payload)
    if errors:
        raise SteeringValidationError(errors)


__all__ = [
    "MAX_STEERING_DEPTH",
    "MAX_STEERING_KEYS",
    "MAX_STEERING_LIST_ITEMS",
    "MAX_STEERING_PAYLOAD_BYTES",
    "MAX_STEERING_STRING",
    "TRUNCATED",
    "TRUNCATED_KEYS",
    "sanitize_payload",
    "sanitize_steering_event",
    "validate_steering_event",
]
