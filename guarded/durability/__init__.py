"""Durability: what stands behind "nothing acknowledged is lost".

:class:`~.owner.Durability` (:mod:`.owner`) is the one owner of the batcher (:mod:`.batching`,
with the bulk forms of methods in :mod:`.bulk_forms`), the dead-letter buffer, the stale cache
(:mod:`.stale`), their lifecycle, the replay and the drain at shutdown (:mod:`.shutdown`); the
artifact side (:mod:`.artifact_side`, :mod:`.local_artifacts`) keeps artifacts when the backend
cannot. The layers receive only narrow ports of it (:mod:`.ports`).

This package imports none of its modules: :mod:`guarded.deadletter` uses :mod:`.bulk_forms`, and
:mod:`.owner` uses the dead-letter buffer.
"""
