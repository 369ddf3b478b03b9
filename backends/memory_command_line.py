"""The in-memory backend's part of the ``guarded`` command line (:data:`COMMAND_LINE`): it has no
command of its own; ``guarded check`` learns from it that a new in-memory store keeps nothing."""

from __future__ import annotations

from guarded.backends.memory import InMemoryStateStore
from guarded.cli.plugin import BackendCommandLine, ScratchPlace


class MemoryCommandLine(BackendCommandLine):
    """The in-memory store as the commands that work with any store see it."""

    def scratch_place(self, store: object, namespace: str, factory: str) -> ScratchPlace | None:
        if not isinstance(store, InMemoryStateStore):
            return None
        return ScratchPlace("in_memory", "a new in-memory store")


COMMAND_LINE = MemoryCommandLine()
"""The backend's command line, listed in :data:`guarded.cli.plugin.BUILT_IN`."""

__all__ = ["COMMAND_LINE", "MemoryCommandLine"]
