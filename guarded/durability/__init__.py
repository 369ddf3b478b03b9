"""Durability: what stands behind "nothing acknowledged is lost".

:class:`~.owner.Durability` (:mod:`.owner`) is the one owner of the batcher
(:mod:`guarded.batching`), the dead-letter buffer (:mod:`guarded.deadletter`), their lifecycle,
the replay and the drain at shutdown (:mod:`.shutdown`). The layers receive only narrow ports of
it, and it receives from the guard only its internal call and the breaker's wait (:mod:`.ports`).
The guarded artifact store builds one of its own for held artifact puts
(:mod:`guarded.artifact_side`).

This package imports none of its modules.
"""
