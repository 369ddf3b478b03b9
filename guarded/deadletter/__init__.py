"""The dead-letter buffer: writes that finally failed are kept, spilled to SQLite, replayed in order.

* :mod:`.calls` encodes a store write call to JSON and back, losslessly;
* :mod:`.entries` defines what the buffer holds (:class:`DeadLetter`, :class:`ParkedWrite`);
* :mod:`.spill` is the durable SQLite spill file (single writer, ``flock``-ed): its layout, errors,
  lock, opening and migration, the quarantine of rows that cannot be read, and its writes;
* :mod:`.slots` gives each process a slot file of its own beside the configured path;
* :mod:`.buffer` is the :class:`DeadLetterBuffer` the guard uses, composed of: :mod:`.held` (the
  in-memory index of held writes), :mod:`.spill_link` (the worker thread, the lock and the spill
  file's lifecycle), :mod:`.group_commit` (puts, coalesced and committed together),
  :mod:`.last_write_wins`, :mod:`.parking`, :mod:`.replay_pass` and :mod:`.replayed` (one replay
  pass), :mod:`.adoption` (orphaned slot files), :mod:`.listing`, :mod:`.unpark_purge`,
  :mod:`.closing`, :mod:`.counters` (its totals) and :mod:`.status` (what it reports: depth,
  spill file, gauges and stats);
* :mod:`.replay` the replay vocabulary (:class:`ReplayResult`, :class:`ReplaySummary`, pacing);
* :mod:`.telemetry` the ``guarded_deadletter_*`` metrics and the log of dropped writes.
"""

from .buffer import DeadLetterBuffer, PutItem
from .calls import CALL_SPECS, decode_call, encode_call
from .entries import DeadLetter, DeadLetterStats, ParkedWrite, canonical_key
from .replay import (
    REPLAY_FAILURE_STREAK,
    Call,
    CallCheck,
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
    "Call",
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
