"""The dead-letter buffer: writes that finally failed are kept, spilled to SQLite, replayed in order.

* :mod:`.calls` encodes a store write call to JSON and back, losslessly;
* :mod:`.entries` defines what the buffer holds (:class:`DeadLetter`, :class:`ParkedWrite`);
* :mod:`.spill` is the durable SQLite spill file (single writer, ``flock``-ed): its layout, errors,
  lock, opening and migration, the quarantine of rows that cannot be read, and its writes;
* :mod:`.slots` gives each process a slot file of its own beside the configured path, and decides
  which writes of an orphaned slot file (of a process that is gone) win when it is adopted;
* :mod:`.spill_link` holds the writes kept, in memory (:class:`~.spill_link.HeldIndex`, the index
  by key and scope) and in the spill file, and is the one owner of both that keeps them in step
  (:class:`~.spill_link.SpillLink`: the worker thread, the lock, the file's lifecycle and every
  change of what is held);
* :mod:`.replay` replays them: what a sender answers (:class:`ReplayResult`), what a pass reports
  (:class:`ReplaySummary`), pacing, calls that can never succeed, and one replay pass;
* :mod:`.buffer` is the :class:`DeadLetterBuffer` the guard uses: puts committed together (group
  commit), last-write-wins keys, parking, replay, listing, maintenance, closing and its reports;
* :mod:`.gate` orders direct writes of a last-write-wins key against its replay;
* :mod:`.telemetry` the ``guarded_deadletter_*`` metrics, a buffer's totals and the log of dropped
  writes.
"""

from .buffer import DeadLetterBuffer, PutItem
from .call_codec import CALL_SPECS, decode_call, encode_call
from .entries import DeadLetter, DeadLetterStats, ParkedWrite, canonical_key
from .replay import (
    REPLAY_FAILURE_STREAK,
    CallCheck,
    HeldCall,
    ReplayRejected,
    ReplayResult,
    ReplaySummary,
    Send,
    SendBulk,
    TokenBucket,
    store_sender,
)
from .slots import MAX_SLOTS, slot_files, slot_path
from .spill import (
    QuarantinedRow,
    SpillFile,
    SpillFileCorruptError,
    SpillFileError,
    SpillFileForeignError,
    SpillFileLockedError,
    SpillFileTargetError,
    SpillFileVersionError,
)

__all__ = [
    "CALL_SPECS",
    "MAX_SLOTS",
    "REPLAY_FAILURE_STREAK",
    "HeldCall",
    "CallCheck",
    "DeadLetter",
    "DeadLetterBuffer",
    "DeadLetterStats",
    "ParkedWrite",
    "PutItem",
    "QuarantinedRow",
    "ReplayRejected",
    "ReplayResult",
    "ReplaySummary",
    "Send",
    "SendBulk",
    "SpillFile",
    "SpillFileCorruptError",
    "SpillFileError",
    "SpillFileForeignError",
    "SpillFileLockedError",
    "SpillFileTargetError",
    "SpillFileVersionError",
    "TokenBucket",
    "canonical_key",
    "decode_call",
    "encode_call",
    "slot_files",
    "slot_path",
    "store_sender",
]
