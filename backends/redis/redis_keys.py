"""The key layout of the Redis store: every key is ``<prefix>:{<tag>}:<kind>...``.

**One hash tag per session, trace, token, task or artifact.** Redis Cluster hashes only the part
of a key between the first ``{`` and the next ``}``, so every key of one tag is in one slot, and
every command or script of one call of the store touches keys of one tag only: no ``CROSSSLOT``
on a cluster. The tags::

    {s.<session>}   memory (by the last ':'-segment of its key), tasks listed, updates, steering,
                    traces listed, bindings of a router session, artifacts of a session
    {t.<trace>}     events, planner events, the trajectory, remote bindings
    {p.<token>}     a planner pause
    {k.<task>}      a task's state
    {a.<artifact>}  an artifact's bytes and ref

**A caller's id is escaped, never interpreted** (:func:`escape_id`): percent-encoding of its
UTF-8 with only ``A-Z a-z 0-9 _ . - ~`` left as they are. The encoding is reversible and never
yields ``{``, ``}``, ``*``, ``?``, ``[``, ``]``, ``\\``, ``:`` or whitespace, so an id can neither
move its key to another slot nor end its own part of the key, and two distinct ids never give one
key. No key pattern (``KEYS``/``SCAN``) is ever built from an id: lists are read from index keys.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, unquote

from guarded.errors import InvalidPayloadError

_FORBIDDEN_IN_PREFIX = frozenset("{}*?[]\\") | frozenset(" \t\r\n\v\f")


_LEFT_AS_IS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
"""What percent-encoding leaves as it is (``urllib.parse``'s always-safe characters)."""


def escape_id(value: str) -> str:
    """The key form of a caller's id (see the module docs); ``value`` is valid text (no lone
    surrogates: the store checks it first)."""
    if _LEFT_AS_IS.issuperset(value):  # nothing to encode: the id as it is, without quote's work
        return value
    return quote(value, safe="")


def unescape_id(escaped: str) -> str:
    """Invert :func:`escape_id`."""
    return unquote(escaped, errors="strict")


def check_prefix(prefix: str) -> str:
    """``prefix`` when it can start every key of a store: non-empty text without a hash-tag brace,
    a glob character, a backslash or whitespace; :class:`ValueError` otherwise."""
    if not isinstance(prefix, str) or not prefix:
        raise ValueError("the Redis key prefix must be a non-empty string")
    bad = sorted(set(prefix) & _FORBIDDEN_IN_PREFIX)
    if bad:
        raise ValueError(f"the Redis key prefix may not contain {''.join(bad)!r} (hash tags, globs, spaces)")
    return prefix


def memory_group(key: str) -> str:
    """The part of a memory key (or of a session id asked for) after its last ``:``.

    ``list_memory_keys(session_id)`` lists the keys ending with ``:<session_id>``; such a key and
    that session id end with the same last segment, so the keys of one segment share a slot and an
    index (spec 003's ``tenant:user:session``: the session)."""
    return key.rsplit(":", 1)[-1]


NO_CONTEXT = "n"
"""The key part of a remote binding's ``context_id`` ``None`` (a context id's part starts ``v``)."""


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """The keys of one store, under its ``prefix`` (see the module docs)."""

    prefix: str

    def _key(self, tag: str, kind: str) -> str:
        return f"{self.prefix}:{{{tag}}}:{kind}"

    # --- traces ---------------------------------------------------------------------------------

    def trace_tag(self, trace_id: str) -> str:
        return f"t.{escape_id(trace_id)}"

    def events(self, trace_id: str) -> tuple[str, str]:
        """The stream of a trace's runtime events and the set of their fingerprints."""
        tag = self.trace_tag(trace_id)
        return self._key(tag, "events"), self._key(tag, "events:seen")

    def planner_events(self, trace_id: str) -> tuple[str, str]:
        """The stream of a trace's planner events and the set of their call keys."""
        tag = self.trace_tag(trace_id)
        return self._key(tag, "planner"), self._key(tag, "planner:keys")

    def trajectory(self, trace_id: str) -> str:
        return self._key(self.trace_tag(trace_id), "trajectory")

    def binding_member(self, trace_id: str, context_id: str | None, task_id: str) -> str:
        """A binding's name in its router session's indexes: its three key parts, escaped."""
        context = NO_CONTEXT if context_id is None else "v" + escape_id(context_id)
        return f"{escape_id(trace_id)}:{context}:{escape_id(task_id)}"

    def binding(self, trace_id: str, context_id: str | None, task_id: str) -> str:
        member = self.binding_member(trace_id, context_id, task_id)
        return self.binding_of_member(member)

    def binding_of_member(self, member: str) -> str:
        """The record key of the binding an index names."""
        trace, context, task = member.split(":")
        return self._key(f"t.{trace}", f"binding:{context}:{task}")

    # --- sessions -------------------------------------------------------------------------------

    def session_tag(self, session_id: str) -> str:
        return f"s.{escape_id(session_id)}"

    def memory(self, key: str) -> tuple[str, str]:
        """A memory state's record and the index of the keys of its :func:`memory_group`."""
        tag = self.session_tag(memory_group(key))
        return self._key(tag, f"memory:{escape_id(key)}"), self._key(tag, "memory-keys")

    def memory_index(self, session_id: str) -> str:
        return self._key(self.session_tag(memory_group(session_id)), "memory-keys")

    def tasks_of(self, session_id: str) -> str:
        """The session's task index (member: the task id; score: when first saved there)."""
        return self._key(self.session_tag(session_id), "tasks")

    def stream(self, kind: str, session_id: str) -> tuple[str, str]:
        """A session's ``updates`` or ``steering`` stream and the hash of its item ids."""
        tag = self.session_tag(session_id)
        return self._key(tag, kind), self._key(tag, f"{kind}:ids")

    def traces_of(self, session_id: str) -> str:
        """The session's trace index (member: the trace id; score: when last saved there)."""
        return self._key(self.session_tag(session_id), "traces")

    def bindings_of(self, router_session_id: str) -> tuple[str, str]:
        """The router session's binding indexes: by first save, and by last save."""
        tag = self.session_tag(router_session_id)
        return self._key(tag, "bindings"), self._key(tag, "bindings:saved")

    # --- tokens, tasks, artifacts ----------------------------------------------------------------

    def pause(self, token: str) -> str:
        return self._key(f"p.{escape_id(token)}", "pause")

    def task(self, task_id: str) -> str:
        return self._key(f"k.{escape_id(task_id)}", "task")

    def artifact(self, artifact_id: str) -> str:
        return self._key(f"a.{escape_id(artifact_id)}", "artifact")

    def artifacts_of(self, group: str, key: str | None) -> str:
        """The index of an artifact group: ``session`` or ``trace`` with its id, or the artifacts
        without one (``key`` ``None``)."""
        tag = (
            f"g.{group[0]}"
            if key is None
            else (self.session_tag(key) if group == "session" else self.trace_tag(key))
        )
        return self._key(tag, f"artifacts:{group}")

    def all_artifacts(self) -> str:
        """The index of every artifact, in insertion order (``artifact_store.list()``)."""
        return self._key("artifacts", "all")

    def everything(self) -> str:
        """The ``SCAN`` pattern of every key of the store (the prefix is the operator's, never a
        caller's id): ``guarded check`` drops its scratch prefix with it."""
        return f"{self.prefix}:*"


def checked_id(value: object, path: str) -> str:
    """``value`` when it is a string, else :class:`InvalidPayloadError` naming ``path``."""
    if not isinstance(value, str):
        raise InvalidPayloadError(f"expected a string, got {type(value).__name__}", path=path)
    return value


__all__ = [
    "NO_CONTEXT",
    "KeyLayout",
    "check_prefix",
    "checked_id",
    "escape_id",
    "memory_group",
    "unescape_id",
]
