"""Trajectories are opaque to stores; this module gives them a lossless JSON envelope.

A mapping is stored as ``{"format": "mapping", "value": {...}}``. An object with
``serialise()`` / ``from_serialised()`` (PenguiFlow's ``Trajectory``) is stored as
``{"format": "object", "type": "module:QualName", "value": obj.serialise()}`` and comes back
as that class when it is registered (PenguiFlow's is registered on first use when importable);
otherwise its serialised mapping is returned, never a guessed import.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, cast

from ..errors import InvalidPayloadError
from ..models.planner import SerialisableTrajectory, Trajectory
from .json_values import JSONObject, to_json_object

_registry: dict[str, type[SerialisableTrajectory]] = {}
_KNOWN_IMPORTABLE = {"penguiflow.planner.trajectory:Trajectory"}


def type_tag(cls: type) -> str:
    """The ``module:QualName`` tag stored with an object trajectory."""
    return f"{cls.__module__}:{cls.__qualname__}"


def register_trajectory_type(cls: type[SerialisableTrajectory]) -> None:
    """Allow :func:`decode_trajectory` to rebuild objects of ``cls`` via ``cls.from_serialised``."""
    _registry[type_tag(cls)] = cls


def _registered(tag: str) -> type[SerialisableTrajectory] | None:
    if tag not in _registry and tag in _KNOWN_IMPORTABLE:
        module_name, _, qualname = tag.partition(":")
        try:
            register_trajectory_type(getattr(importlib.import_module(module_name), qualname))
        except (ImportError, AttributeError):
            return None
    return _registry.get(tag)


def encode_trajectory(trajectory: Trajectory, path: str = "trajectory") -> JSONObject:
    """Return the JSON envelope of a trajectory; refuse anything that is neither kind."""
    if isinstance(trajectory, Mapping):
        return {"format": "mapping", "value": to_json_object(trajectory, path)}
    serialise = getattr(trajectory, "serialise", None)
    if not callable(serialise):
        raise InvalidPayloadError(
            f"a {type(trajectory).__qualname__} is neither a mapping nor has serialise()", path=path
        )
    return {
        "format": "object",
        "type": type_tag(type(trajectory)),
        "value": to_json_object(serialise(), f"{path}.serialise()"),
    }


def decode_trajectory(envelope: Mapping[str, Any]) -> Trajectory:
    """Rebuild what :func:`encode_trajectory` stored."""
    value = envelope.get("value")
    if not isinstance(value, Mapping):
        raise InvalidPayloadError("trajectory envelope has no mapping 'value'", path="trajectory")
    if envelope.get("format") == "object":
        cls = _registered(str(envelope.get("type", "")))
        if cls is not None:
            return cls.from_serialised(value)
    return cast(Trajectory, dict(value))
