"""Which store a held write belongs to, and whether a store keeps anything across processes.

A held write belongs to exactly one store. A store's identity is what it declares in a
``target_identity`` string attribute (the PostgreSQL store: server, database and schema, never
credentials). A store that declares none gets one that only the same store in the same
application can match: the application (:func:`application_identity`), the store's class and the
guard's name. Spill files record the identity of their writes, and nothing is adopted or
replayed into a store of another identity.

A store that keeps nothing across processes declares ``durable_across_processes = False`` (the
in-memory store does; PenguiFlow's ``InMemoryStateStore`` is known to be one): a write held for
it is worth nothing to another process, so it has no spill file and adopts nothing.
"""

from __future__ import annotations

import hashlib
import os
import sys

from .backend import DURABLE_ACROSS_PROCESSES as DURABLE_ATTRIBUTE
from .backend import TARGET_IDENTITY as IDENTITY_ATTRIBUTE

_NOT_DURABLE_CLASSES = frozenset({"penguiflow.state.in_memory.InMemoryStateStore"})
"""Stores known to keep nothing across processes that cannot declare it themselves."""

DIGEST_LENGTH = 12
"""Hexadecimal digits of an identity's digest in a default spill file name."""


def declared_identity(store: object) -> str | None:
    """The store's own ``target_identity``, or ``None`` for a store that does not say."""
    found = getattr(store, IDENTITY_ATTRIBUTE, None)
    return found if isinstance(found, str) and found else None


def durable_across_processes(store: object) -> bool:
    """Whether ``store`` keeps its data across processes: what it declares in
    ``durable_across_processes``, else ``False`` for a store known to keep nothing (PenguiFlow's
    in-memory store), else ``True``."""
    declared = getattr(store, DURABLE_ATTRIBUTE, None)
    if isinstance(declared, bool):
        return declared
    return not any(
        f"{cls.__module__}.{cls.__qualname__}" in _NOT_DURABLE_CLASSES for cls in type(store).__mro__
    )


def application_identity(configured: str | None = None) -> str:
    """This application as a store identity names it: ``configured`` (the setting
    ``dead_letter.application``) when given, else the resolved path of the main program (the
    script, or the ``__main__`` module of ``python -m``), else, interactive or ``python -c``, the
    working directory. Worker processes (multiprocessing, a server's workers) share their parent's."""
    if configured:
        return configured
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if isinstance(main, str) and main:
        return os.path.realpath(main)
    return f"interactive in {os.path.realpath(os.getcwd())}"


def store_identity(store: object, store_name: str, *, application: str | None = None) -> str:
    """The identity of the held writes of the guard ``store_name`` over ``store``: the store's
    :func:`declared_identity`, else ``app=<application> store=<module.class> guard=<name>``."""
    declared = declared_identity(store)
    if declared is not None:
        return declared
    cls = type(store)
    store_class = f"{cls.__module__}.{cls.__qualname__}"
    return f"app={application_identity(application)} store={store_class} guard={store_name}"


def identity_digest(identity: str) -> str:
    """A short digest of ``identity`` for a file name (the default spill path's ``{identity}``)."""
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()[:DIGEST_LENGTH]


__all__ = [
    "DURABLE_ATTRIBUTE",
    "IDENTITY_ATTRIBUTE",
    "application_identity",
    "declared_identity",
    "durable_across_processes",
    "identity_digest",
    "store_identity",
]
