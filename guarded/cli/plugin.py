"""The command-line plugin interface: what a backend adds to the ``guarded`` command, and what it
tells the commands that work with any store. A backend's command line imports this module and
nothing else of :mod:`guarded.cli`.

A backend's part of the command line is a :class:`BackendCommandLine`. guarded finds the ones it
ships by name (:data:`BUILT_IN`) and others through the :data:`ENTRY_POINT_GROUP` entry points, so
a backend installed beside guarded plugs in without guarded importing it::

    # pyproject.toml of the package that holds the backend
    [project.entry-points."guarded.command_lines"]
    redis = "guarded_redis.command_line:COMMAND_LINE"

The object may add its own command (``guarded pg migrate``, with :meth:`~BackendCommandLine.register`)
and tells ``guarded check``, ``guarded dlq replay`` and ``guarded snapshot`` what they cannot know of
its stores: which errors mean its server could not be reached (exit 3), which of its errors mean
something of their own (a schema not migrated: exit 4), which target one of its factories tried,
and where ``guarded check`` runs the contracts (a scratch namespace it creates and drops).

A command of a backend follows the conventions of docs/cli.md with what is exported here: the exit
codes and the :class:`CommandError` family (one ``error: ...; hint: ...`` line and its exit code,
printed by :func:`report`), argument types (:func:`duration`, :func:`whole_number`),
:func:`interrupted` for Ctrl-C, :class:`Progress` for long operations, and :func:`print_table`,
:func:`format_bytes`, :func:`format_duration` for what it prints.
"""

from __future__ import annotations

import argparse
import functools
import importlib
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TypeAlias

from .formatting import Column, format_bytes, print_table
from .progress import Progress
from .support import (
    EXIT_INTERRUPTED,
    EXIT_NOT_MIGRATED,
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    ArgumentParser,
    CommandError,
    Interrupted,
    NotMigratedError,
    ProblemError,
    UnreachableError,
    UsageError,
    duration,
    format_duration,
    interrupted,
    report,
    warn,
    whole_number,
)

Subparsers: TypeAlias = "argparse._SubParsersAction[ArgumentParser]"
"""What :meth:`BackendCommandLine.register` adds its command to (``guarded``'s subcommands, whose
parsers print their errors as one ``error: ...; hint: ...`` line)."""

ENTRY_POINT_GROUP = "guarded.command_lines"
"""The entry-point group a backend installed beside guarded lists its :class:`BackendCommandLine` in."""

BUILT_IN: tuple[str, ...] = (
    "guarded.backends.postgres.command_line:COMMAND_LINE",
    "guarded.backends.memory_command_line:COMMAND_LINE",
    "guarded.backends.redis.redis_command_line:COMMAND_LINE",
)
"""The command lines of the backends shipped with guarded, as ``module:attribute``."""


@dataclass(frozen=True, slots=True)
class ScratchPlace:
    """Where a store of the backend keeps what ``guarded check`` writes: the scratch namespace."""

    kind: str
    """A short name for the kind of place, in ``--json`` output: ``postgresql_schema``, ``in_memory``."""
    where: str
    """The place for a reader: ``PostgreSQL schema guarded_check_... in postgresql://HOST:PORT/DB``."""
    target: str | None = None
    """The server holding it, never with a password; ``None`` when there is none."""
    drop_by_hand: str | None = None
    """What drops it by hand when the check cannot (``DROP SCHEMA "..." CASCADE``); ``None``: the
    place keeps nothing once the store is closed, so there is nothing to drop."""


@dataclass(frozen=True, slots=True)
class TargetTried:
    """The server a command tried to reach, said in its error (exit 3)."""

    description: str
    """The target and where it came from: ``postgresql://HOST:PORT/DB?schema=S (from GUARDED_PG_DSN)``."""
    identity: str
    """The target alone, never with a password (``target`` of the ``--json`` error)."""
    hint: str
    """What the operator sets or checks: ``set GUARDED_PG_DSN ... and check that the server is up``."""


class BackendCommandLine:
    """A backend's part of the ``guarded`` command line. Subclass it and override what applies;
    each default says "nothing of mine"."""

    def register(self, subparsers: Subparsers) -> None:
        """Add the backend's own command to ``subparsers`` (default: none).

        Give the parser a ``description`` and set ``handler`` (``Namespace -> int``, the exit code)
        as a default: ``parser.set_defaults(handler=...)``."""

    def is_unreachable(self, error: BaseException) -> bool:
        """Whether ``error`` (raised by one of the backend's stores or its driver) says the server
        could not be reached or would not take a connection: the command exits 3."""
        return False

    def command_error(self, error: BaseException) -> CommandError | None:
        """The :class:`CommandError` that ``error`` of the backend means, when it means one of its
        own (a schema whose migrations are pending: :class:`NotMigratedError`); ``None`` otherwise."""
        return None

    def factory_target(self, factory_module: str) -> TargetTried | None:
        """The target a factory in ``factory_module`` (the ``module`` of ``guarded check
        module:callable``) tried when it could not reach its server; ``None`` when the module is
        not one of the backend's factories or the target cannot be told."""
        return None

    def scratch_variables(self, namespace: str) -> dict[str, str]:
        """Environment variables that make the backend's factories build their store in the
        scratch ``namespace`` of ``guarded check`` (set while the factory runs)."""
        return {}

    def scratch_place(self, store: object, namespace: str, factory: str) -> ScratchPlace | None:
        """Where ``store`` keeps its data when it is one of the backend's stores (``None``
        otherwise). A store outside the scratch ``namespace`` raises :class:`UsageError`: the
        contracts would write into it. ``factory`` is the ``module:callable`` that built it."""
        return None

    async def drop_scratch(self, store: object, namespace: str) -> None:
        """Drop the scratch ``namespace`` through ``store`` (before the check closes it); raise when
        it could not be dropped. Called only for a :meth:`scratch_place` with ``drop_by_hand``."""


def _load(reference: str) -> BackendCommandLine:
    module, _, attribute = reference.partition(":")
    found = getattr(importlib.import_module(module), attribute)
    if not isinstance(found, BackendCommandLine):
        raise TypeError(f"{reference} is a {type(found).__name__}, not a BackendCommandLine")
    return found


@functools.cache
def backend_command_lines() -> tuple[BackendCommandLine, ...]:
    """Every backend's command line: the built-in ones (:data:`BUILT_IN`), then those of the
    :data:`ENTRY_POINT_GROUP` entry points, each loaded once."""
    found = [_load(reference) for reference in BUILT_IN]
    found.extend(_load(point.value) for point in entry_points(group=ENTRY_POINT_GROUP))
    return tuple(found)


def is_unreachable(error: BaseException) -> bool:
    """Whether any backend says ``error`` means its server could not be reached."""
    return any(command_line.is_unreachable(error) for command_line in backend_command_lines())


def command_error(error: BaseException) -> CommandError | None:
    """The :class:`CommandError` a backend says ``error`` means, if one does."""
    for command_line in backend_command_lines():
        found = command_line.command_error(error)
        if found is not None:
            return found
    return None


__all__ = [
    "BUILT_IN",
    "ENTRY_POINT_GROUP",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_MIGRATED",
    "EXIT_OK",
    "EXIT_PROBLEM",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "BackendCommandLine",
    "Column",
    "CommandError",
    "Interrupted",
    "NotMigratedError",
    "Progress",
    "ProblemError",
    "ScratchPlace",
    "Subparsers",
    "TargetTried",
    "UnreachableError",
    "UsageError",
    "backend_command_lines",
    "command_error",
    "duration",
    "format_bytes",
    "format_duration",
    "interrupted",
    "is_unreachable",
    "print_table",
    "report",
    "warn",
    "whole_number",
]
