"""Durability: what stands behind "nothing acknowledged is lost".

:class:`Durability` (:mod:`.owner`) is the one owner of the batcher, the dead-letter buffer, the
stale cache, their lifecycle and the replay. The layers receive only narrow ports of it
(:mod:`.ports`).
"""

from .owner import Durability, InternalCall, target_identity
from .ports import (
    DirectWriteGate,
    DurabilityPorts,
    HeldWriteKeeper,
    HeldWriteLookups,
    Lifecycle,
    WriteQueue,
)

__all__ = [
    "DirectWriteGate",
    "Durability",
    "DurabilityPorts",
    "HeldWriteKeeper",
    "HeldWriteLookups",
    "InternalCall",
    "Lifecycle",
    "WriteQueue",
    "target_identity",
]
