"""Closing a dead-letter buffer's spill file: one last attempt to move memory-only writes into a
failed file, then the file is closed (its lock released), or removed when it is an empty slot file
other than the base path itself, and the worker thread stops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .slots import slot_of
from .spill import SpillFile
from .spill_link import SPILL_ERRORS, SpillLink

logger = logging.getLogger("guarded.deadletter")


async def close_link(link: SpillLink, on_closed: Callable[[], None]) -> None:
    """(Under the lock.) Close ``link`` for good; ``on_closed`` runs once it takes nothing more."""
    held = link.held
    if link.failed and (held.volatile or held.parked_memory or held.pending_deletes):
        try:
            await link.recover()
        except Exception:
            logger.exception("last attempt to use the spill file of store %r failed", link.store_name)
    link.closed = True
    on_closed()
    spill, executor = link.spill, link.executor
    link.spill = link.executor = None
    if executor is not None:
        if spill is not None:
            await _close_file(link, spill, executor)
        executor.shutdown(wait=False)


async def _close_file(link: SpillLink, spill: SpillFile, executor: ThreadPoolExecutor) -> None:
    files, held = link.files, link.held
    removable = (
        files is not None
        and not files.pinned
        and slot_of(files.base, spill.path) not in (None, 0)
        and spill.is_empty
        and not held.volatile
        and not held.parked_memory
        and not held.pending_deletes
    )
    try:
        await asyncio.get_running_loop().run_in_executor(executor, spill.remove if removable else spill.close)
    except SPILL_ERRORS as exc:
        logger.warning(
            "closing dead-letter spill file %r of store %r failed: %s",
            spill.path,
            link.store_name,
            exc,
            extra={"event": "deadletter_close_failed", "store": link.store_name},
        )


__all__ = ["close_link"]
