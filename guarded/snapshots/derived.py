"""The queries every :class:`~guarded.snapshots.snapshot_store.SnapshotStore` answers from its own ``get``
and ``load``: a backend's ``lineage`` and ``diff`` call these."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .diff import diff_contents
from .snapshot_errors import SnapshotNotFoundError

if TYPE_CHECKING:
    from .record import Snapshot, SnapshotDiff
    from .snapshot_store import SnapshotStore


async def lineage_of(store: SnapshotStore, snapshot_id: str) -> list[Snapshot]:
    """``snapshot_id``'s record, then its parent's, and so on up to the first ancestor ``store``
    no longer has (a cycle ends the chain too)."""
    chain = [await store.get(snapshot_id)]
    seen = {snapshot_id}
    while (parent := chain[-1].parent_id) is not None and parent not in seen:
        seen.add(parent)
        try:
            chain.append(await store.get(parent))
        except SnapshotNotFoundError:
            break
    return chain


async def diff_of(store: SnapshotStore, a: str, b: str) -> SnapshotDiff:
    """What changed from snapshot ``a`` to snapshot ``b`` of ``store``."""
    first = await store.load(a)
    try:
        second = await store.load(b)
        try:
            return await diff_contents(first, second)
        finally:
            await second.aclose()
    finally:
        await first.aclose()
