"""The Lua scripts of the Redis store (``lua/*.lua``, each with ``lua/prelude.lua`` in front),
registered once per client: redis-py sends ``EVALSHA`` and loads a script the server does not
know (``NOSCRIPT``), on a single node and on a cluster alike."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

SCRIPT_NAMES = (
    "binding_mark",
    "binding_save",
    "events_append",
    "index_add",
    "memory_save",
    "pause_save",
    "pause_take",
    "planner_append",
    "stream_append",
    "task_save",
    "trajectory_save",
    "artifact_touch",
)


@cache
def script_text(name: str) -> str:
    """The source sent to the server: the prelude, then the script ``lua/<name>.lua``."""
    folder = resources.files(__package__).joinpath("lua")
    return (
        folder.joinpath("prelude.lua").read_text("utf-8")
        + "\n"
        + folder.joinpath(f"{name}.lua").read_text("utf-8")
    )


@dataclass(frozen=True, slots=True)
class Scripts:
    """Every script, registered on one client (``scripts.memory_save(keys=..., args=...)``)."""

    by_name: dict[str, Any]

    @classmethod
    def on(cls, client: Any) -> Scripts:
        return cls({name: client.register_script(script_text(name)) for name in SCRIPT_NAMES})

    def __getattr__(self, name: str) -> Any:
        try:
            return self.by_name[name]
        except KeyError:
            raise AttributeError(name) from None


__all__ = ["SCRIPT_NAMES", "Scripts", "script_text"]
