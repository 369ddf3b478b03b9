"""In-memory :class:`~guarded.models.ArtifactStore` with every retention rule (spec 000 "Artifact Store").

The bounded local store of the core: a guarded artifact store keeps in it what its backend cannot
take, and the in-memory backend (:mod:`guarded.backends.memory`) uses it as its artifact store.

IDs are content-addressed like PenguiFlow's (``{namespace or 'art'}_{sha256[:12]}``), so putting
the same content under the same namespace returns the existing reference. Limits of
:class:`~guarded.models.ArtifactRetentionConfig`:

* ``ttl_seconds``: an artifact older than this is invisible to every method and purged; a put
  of the same content refreshes it. ``<= 0`` means no expiry.
* ``max_artifact_bytes``: a larger artifact is refused with :class:`ArtifactTooLargeError`.
* ``max_session_bytes`` / ``max_artifacts_per_session``: per ``scope.session_id``; artifacts
  without a session id share one group (PenguiFlow's Playground calls it ``"default"``).
* ``max_trace_bytes`` / ``max_artifacts_per_trace``: per ``scope.trace_id``; an artifact
  without a trace id belongs to no trace and only its session's limits apply.
* ``cleanup_strategy``: when a put would exceed a group limit, ``"lru"`` evicts the least
  recently used artifacts of that group (``get`` and ``put`` count as use), ``"fifo"`` the
  oldest inserted, and ``"none"`` refuses the put with :class:`ArtifactLimitError`.

A limit ``<= 0`` is disabled. A put that fails evicts nothing. Refs are stored encoded with
:mod:`guarded.codec` and rebuilt on every read, so callers never share objects with the store;
``meta`` must therefore be strict JSON, as in a durable backend.
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Generic, TypeVar, cast

from .codec import (
    ARTIFACT_REF,
    ARTIFACT_SCOPE,
    check_text,
    optional_text_argument,
    refusing,
    text_argument,
    to_json_object,
)
from .errors import InvalidPayloadError
from .models import ArtifactRef, ArtifactRetentionConfig, ArtifactScope

_INVALID_NAMESPACE_CHARS = re.compile(r"[^A-Za-z0-9_-]+")


class ArtifactTooLargeError(ValueError):
    """An artifact is larger than ``max_artifact_bytes``."""


class ArtifactLimitError(ValueError):
    """A put cannot fit a session or trace limit; ``limit`` names the retention field.

    Raised when ``cleanup_strategy`` is ``"none"``, or when the artifact alone exceeds
    ``max_session_bytes`` / ``max_trace_bytes`` (no eviction could make room).
    """

    def __init__(self, message: str, *, limit: str) -> None:
        self.limit = limit
        super().__init__(message)


def sanitize_artifact_namespace(namespace: str | None) -> str | None:
    """The namespace reduced to ``[A-Za-z0-9_-]`` for use in an ID (PenguiFlow's rule), or ``None``."""
    if namespace is None:
        return None
    return _INVALID_NAMESPACE_CHARS.sub("_", namespace).strip("_-") or None


def artifact_id(data: bytes, namespace: str | None = None) -> str:
    """PenguiFlow's content-addressed artifact ID: ``{sanitized namespace or 'art'}_{sha256[:12]}``."""
    return f"{sanitize_artifact_namespace(namespace) or 'art'}_{hashlib.sha256(data).hexdigest()[:12]}"


@dataclass(slots=True)
class _Stored:
    ref: str
    data: bytes
    groups: dict[str, str | None]
    created_at: float
    inserted: int
    used: int


def checked_artifact_bytes(data: object, retention: ArtifactRetentionConfig) -> bytes:
    """``data`` as ``bytes``: an :class:`~guarded.errors.InvalidPayloadError` for anything but
    bytes, an :class:`ArtifactTooLargeError` past ``max_artifact_bytes``."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidPayloadError(f"expected bytes, got {type(data).__name__}", path="data")
    data = bytes(data)
    max_bytes = retention.max_artifact_bytes
    if 0 < max_bytes < len(data):
        raise ArtifactTooLargeError(f"artifact of {len(data)} bytes exceeds max_artifact_bytes={max_bytes}")
    return data


def new_artifact_ref(
    data: bytes,
    *,
    mime_type: str | None,
    filename: str | None,
    namespace: str | None,
    scope: Any,
    meta: dict[str, Any] | None,
) -> dict[str, Any]:
    """The ref of a put of ``data``, encoded as stored (:data:`~guarded.codec.ARTIFACT_REF`): its
    content-addressed id (:func:`artifact_id`), size and SHA-256, ``meta`` as its ``source``
    (strict JSON, else an :class:`~guarded.errors.InvalidPayloadError`)."""
    ref: dict[str, Any] = ARTIFACT_REF.encode(
        SimpleNamespace(
            id=artifact_id(data, namespace),
            mime_type=mime_type,
            size_bytes=len(data),
            filename=filename,
            sha256=hashlib.sha256(data).hexdigest(),
            scope=scope,
            namespace=namespace,
            source=to_json_object(meta or {}, "meta"),
        )
    )
    return ref


def ref_groups(ref: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The session and trace ids of an encoded ref's scope (``None`` where it has none)."""
    scope = ref["scope"] if isinstance(ref["scope"], dict) else {}
    session, trace = scope.get("session_id"), scope.get("trace_id")
    return (session if isinstance(session, str) else None, trace if isinstance(trace, str) else None)


@dataclass(frozen=True, slots=True)
class GroupLimit:
    """The retention limits of the session or trace group ``key`` an artifact belongs to, and the
    eviction that makes room in it."""

    group: str
    """``"session"`` or ``"trace"``."""
    key: str | None
    max_count: int
    max_bytes: int

    @classmethod
    def session(cls, key: str | None, retention: ArtifactRetentionConfig) -> GroupLimit:
        """The limits of session ``key``."""
        return cls("session", key, retention.max_artifacts_per_session, retention.max_session_bytes)

    @classmethod
    def trace(cls, key: str | None, retention: ArtifactRetentionConfig) -> GroupLimit:
        """The limits of trace ``key``."""
        return cls("trace", key, retention.max_artifacts_per_trace, retention.max_trace_bytes)

    @property
    def count_field(self) -> str:
        """The retention field limiting the group's artifact count."""
        return f"max_artifacts_per_{self.group}"

    @property
    def bytes_field(self) -> str:
        """The retention field limiting the group's bytes."""
        return f"max_{self.group}_bytes"

    def check_fits_alone(self, size: int) -> None:
        """An :class:`ArtifactLimitError` when an artifact of ``size`` bytes exceeds the group's
        bytes on its own (no eviction could make room)."""
        if 0 < self.max_bytes < size:
            raise ArtifactLimitError(
                f"artifact of {size} bytes exceeds {self.bytes_field}={self.max_bytes} on its own",
                limit=self.bytes_field,
            )

    def evictions(self, members: Sequence[tuple[str, int]], size: int, strategy: str) -> list[str]:
        """The ids to evict, in order, of ``members`` (the group's artifacts as ``(id, size)``,
        in the strategy's order) so ``size`` more bytes fit; an :class:`ArtifactLimitError` when
        they would have to go and ``strategy`` is ``"none"``."""
        victims: list[str] = []
        count, total = len(members), sum(member_size for _, member_size in members)
        for member_id, member_size in members:
            over_count = 0 < self.max_count <= count
            if not over_count and not 0 < self.max_bytes < total + size:
                break
            if strategy == "none":
                raise self._limit_error(count, total, size, over_count)
            victims.append(member_id)
            count, total = count - 1, total - member_size
        return victims

    def _limit_error(self, count: int, total: int, size: int, over_count: bool) -> ArtifactLimitError:
        where = f"{self.group} {self.key!r}"
        if over_count:
            return ArtifactLimitError(
                f"{self.count_field}={self.max_count} reached for {where} ({count} stored) "
                "and cleanup_strategy is 'none'",
                limit=self.count_field,
            )
        return ArtifactLimitError(
            f"{self.bytes_field}={self.max_bytes} would be exceeded for {where} "
            f"({total} bytes stored + {size} new) and cleanup_strategy is 'none'",
            limit=self.bytes_field,
        )


class InMemoryArtifactStore:
    """Reference artifact store: every retention rule enforced, a clock injectable for TTL tests.

    Safe for concurrent use on one event loop: no method awaits while changing state.
    """

    def __init__(
        self,
        retention: ArtifactRetentionConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._retention = retention or ArtifactRetentionConfig()
        self._clock = clock
        self._items: dict[str, _Stored] = {}
        self._tick = 0
        self._lock = asyncio.Lock()
        self._evicted = 0
        self._expired = 0

    def moved(self) -> None:
        """Used from a new event loop from now on (the old one closed): a call of the old one may
        hold the lock for good, and a lock that once waited belongs to its loop; a new one serves."""
        self._lock = asyncio.Lock()

    @property
    def retention(self) -> ArtifactRetentionConfig:
        """The retention limits in force."""
        return self._retention

    @property
    def total_bytes(self) -> int:
        """Bytes currently stored, expired artifacts not yet purged included."""
        return sum(len(item.data) for item in self._items.values())

    @property
    def count(self) -> int:
        """Artifacts currently stored, expired artifacts not yet purged included."""
        return len(self._items)

    @property
    def evicted(self) -> int:
        """Artifacts evicted so far to make room (``lru`` / ``fifo``)."""
        return self._evicted

    @property
    def expired(self) -> int:
        """Artifacts purged so far because their TTL passed."""
        return self._expired

    async def put_bytes(
        self,
        data: bytes,
        *,
        mime_type: str | None = None,
        filename: str | None = None,
        namespace: str | None = None,
        scope: ArtifactScope | None = None,
        meta: dict[str, Any] | None = None,
    ) -> ArtifactRef:
        """Store ``data`` and return its ref; identical content and namespace return the existing ref.

        Raises :class:`ArtifactTooLargeError`, :class:`ArtifactLimitError`, or
        :class:`~guarded.errors.InvalidPayloadError` for metadata JSON cannot carry.
        """
        data = checked_artifact_bytes(data, self._retention)
        ref = new_artifact_ref(
            data, mime_type=mime_type, filename=filename, namespace=namespace, scope=scope, meta=meta
        )
        key = ref["id"]
        session, trace = ref_groups(ref)
        groups = {"session": session, "trace": trace}
        text = json.dumps(ref, ensure_ascii=False)
        async with self._lock:
            now = self._clock()
            self._purge_expired(now)
            existing = self._items.get(key)
            if existing is not None:
                existing.created_at = now
                existing.used = self._next_tick()
                return _decode_ref(existing.ref)
            victims = _plan_evictions(self._items, self._retention, groups, len(data))
            for victim in victims:
                del self._items[victim]
            self._evicted += len(victims)
            tick = self._next_tick()
            self._items[key] = _Stored(text, data, groups, now, tick, tick)
        return _decode_ref(text)

    async def put_text(
        self,
        text: str,
        *,
        mime_type: str = "text/plain",
        filename: str | None = None,
        namespace: str | None = None,
        scope: ArtifactScope | None = None,
        meta: dict[str, Any] | None = None,
    ) -> ArtifactRef:
        """Store ``text`` as UTF-8 (see :meth:`put_bytes`); a lone surrogate is an ``InvalidPayloadError``."""
        if not isinstance(text, str):
            raise InvalidPayloadError(f"expected a string, got {type(text).__name__}", path="text")
        data = check_text(text, "text").encode("utf-8")
        return await self.put_bytes(
            data, mime_type=mime_type, filename=filename, namespace=namespace, scope=scope, meta=meta
        )

    async def get(self, artifact_id: str) -> bytes | None:
        """The artifact's bytes, or ``None`` when missing or expired; counts as use for ``lru``."""
        async with self._lock:
            item = self._live(artifact_id)
            if item is None:
                return None
            item.used = self._next_tick()
            return item.data

    async def get_ref(self, artifact_id: str) -> ArtifactRef | None:
        """A fresh copy of the artifact's ref, or ``None`` when missing or expired."""
        async with self._lock:
            item = self._live(artifact_id)
            return None if item is None else _decode_ref(item.ref)

    async def delete(self, artifact_id: str) -> bool:
        """Delete the artifact; ``False`` when it was missing or already expired."""
        async with self._lock:
            if self._live(artifact_id) is None:
                return False
            del self._items[artifact_id]
            return True

    async def exists(self, artifact_id: str) -> bool:
        """Whether the artifact is stored and not expired."""
        async with self._lock:
            return self._live(artifact_id) is not None

    async def list(self, *, scope: ArtifactScope | None = None) -> builtins.list[ArtifactRef]:
        """Refs of live artifacts in insertion order, filtered with :meth:`ArtifactScope.matches`."""
        wanted = _as_scope(scope)
        async with self._lock:
            self._purge_expired(self._clock())
            refs = [_decode_ref(item.ref) for item in self._items.values()]
        return refs if wanted is None else [ref for ref in refs if wanted.matches(ref.scope)]

    def clear(self) -> None:
        """Remove every artifact (testing utility)."""
        self._items.clear()

    def clear_session(self, session_id: str) -> None:
        """Remove every artifact scoped to ``session_id`` (testing utility)."""
        for key in [key for key, item in self._items.items() if item.groups["session"] == session_id]:
            del self._items[key]

    def _next_tick(self) -> int:
        self._tick += 1
        return self._tick

    def _is_expired(self, item: _Stored, now: float) -> bool:
        ttl = self._retention.ttl_seconds
        return ttl > 0 and now - item.created_at > ttl

    def _purge_expired(self, now: float) -> None:
        expired = [key for key, item in self._items.items() if self._is_expired(item, now)]
        for key in expired:
            del self._items[key]
        self._expired += len(expired)

    def _live(self, key: str) -> _Stored | None:
        item = self._items.get(key)
        if item is not None and self._is_expired(item, self._clock()):
            del self._items[key]
            self._expired += 1
            return None
        return item


def _plan_evictions(
    items: dict[str, _Stored],
    retention: ArtifactRetentionConfig,
    groups: dict[str, str | None],
    size: int,
) -> list[str]:
    """Keys to evict so an artifact of ``size`` bytes fits its session and trace, or raise."""
    limits = [GroupLimit.session(groups["session"], retention)]
    if groups["trace"] is not None:
        limits.append(GroupLimit.trace(groups["trace"], retention))
    for limit in limits:
        limit.check_fits_alone(size)
    by_recency = retention.cleanup_strategy == "lru"

    def members_of(limit: GroupLimit) -> list[tuple[str, int]]:
        members = sorted(
            (key for key, item in items.items() if item.groups[limit.group] == limit.key),
            key=lambda key: items[key].used if by_recency else items[key].inserted,
        )
        return [(key, len(items[key].data)) for key in members]

    return plan_evictions(limits, members_of, size, retention.cleanup_strategy)


@dataclass(frozen=True, slots=True)
class ArtifactPut:
    """A checked put: the bytes, the encoded ref (:func:`new_artifact_ref`) and the limits of the
    artifact's session and trace groups, each of which it fits on its own."""

    data: bytes
    ref: dict[str, Any]
    groups: tuple[GroupLimit, GroupLimit]


def prepare_artifact_put(
    data: object,
    retention: ArtifactRetentionConfig,
    *,
    mime_type: object,
    filename: object,
    namespace: object,
    scope: Any,
    meta: dict[str, Any] | None,
    group_key: Callable[[str], str] = str,
) -> ArtifactPut:
    """Check a put of a durable store before any I/O: ``data`` (:func:`checked_artifact_bytes`),
    the optional texts, the ref; the groups are the ref's session and trace (an artifact without
    one is in the group of key ``None``), their keys as ``group_key`` writes them (a backend's
    column escape). Raises :class:`~guarded.errors.InvalidPayloadError`,
    :class:`ArtifactTooLargeError` or :class:`ArtifactLimitError` (too large for a group alone)."""
    data = checked_artifact_bytes(data, retention)
    optional_text_argument(mime_type, "mime_type")
    optional_text_argument(filename, "filename")
    optional_text_argument(namespace, "namespace")
    ref = new_artifact_ref(
        data,
        mime_type=cast(str | None, mime_type),
        filename=cast(str | None, filename),
        namespace=cast(str | None, namespace),
        scope=scope,
        meta=meta,
    )
    session, trace = ref_groups(ref)
    groups = (
        GroupLimit.session(None if session is None else group_key(session), retention),
        GroupLimit.trace(None if trace is None else group_key(trace), retention),
    )
    for group in groups:
        group.check_fits_alone(len(data))
    return ArtifactPut(data, ref, groups)


PreparedPut = TypeVar("PreparedPut")


class CheckedArtifactPuts(Generic[PreparedPut]):
    """``put_bytes`` and ``put_text`` of a durable artifact store, written once: a put is checked
    (:func:`prepare_artifact_put`, its group keys as :meth:`_artifact_group_key` writes them) and
    made into what the store writes (:meth:`_prepared`) before any I/O, so an argument that cannot
    be stored raises :class:`~guarded.errors.InvalidPayloadError`, :class:`ArtifactTooLargeError`
    or :class:`ArtifactLimitError` at once; then it is written (:meth:`_write`)."""

    _retention: ArtifactRetentionConfig

    def _artifact_group_key(self, key: str) -> str:
        """A group's key (a session or trace id) as the store keeps it."""
        return key

    def _prepared(self, put: ArtifactPut, mime_type: str | None) -> PreparedPut:
        """What the store writes for the checked ``put``."""
        raise NotImplementedError

    async def _write(self, prepared: PreparedPut) -> Any:
        """Write ``prepared``; returns the artifact's ref."""
        raise NotImplementedError

    async def put_bytes(
        self,
        data: bytes,
        *,
        mime_type: str | None = None,
        filename: str | None = None,
        namespace: str | None = None,
        scope: Any = None,
        meta: dict[str, Any] | None = None,
    ) -> Any:
        """Store ``data`` and return its ref; identical content and namespace return the stored ref.

        Raises :class:`ArtifactTooLargeError`, :class:`ArtifactLimitError`, or
        :class:`~guarded.errors.InvalidPayloadError` for arguments that cannot be stored.
        """
        with refusing("artifact_store.put_bytes"):
            prepared = self._checked(data, mime_type, filename, namespace, scope, meta)
        return await self._write(prepared)

    async def put_text(
        self,
        text: str,
        *,
        mime_type: str = "text/plain",
        filename: str | None = None,
        namespace: str | None = None,
        scope: Any = None,
        meta: dict[str, Any] | None = None,
    ) -> Any:
        """Store ``text`` as UTF-8 (see :meth:`put_bytes`); a lone surrogate is an ``InvalidPayloadError``."""
        with refusing("artifact_store.put_text"):
            data = text_argument(text, "text").encode("utf-8")
            prepared = self._checked(data, mime_type, filename, namespace, scope, meta)
        return await self._write(prepared)

    def _checked(
        self,
        data: object,
        mime_type: object,
        filename: object,
        namespace: object,
        scope: Any,
        meta: dict[str, Any] | None,
    ) -> PreparedPut:
        put = prepare_artifact_put(
            data,
            self._retention,
            mime_type=mime_type,
            filename=filename,
            namespace=namespace,
            scope=scope,
            meta=meta,
            group_key=self._artifact_group_key,
        )
        return self._prepared(put, cast(str | None, mime_type))


def plan_evictions(
    groups: Sequence[GroupLimit],
    members_of: Callable[[GroupLimit], Sequence[tuple[str, int]]],
    size: int,
    strategy: str,
) -> list[str]:
    """The ids to evict, in order, so an artifact of ``size`` bytes fits every group: each group's
    :meth:`GroupLimit.evictions` over ``members_of(group)`` (its artifacts as ``(id, size)`` in the
    strategy's order) less those already evicted for an earlier group."""
    victims: list[str] = []
    for group in groups:
        members = [member for member in members_of(group) if member[0] not in victims]
        victims += group.evictions(members, size, strategy)
    return victims


def _decode_ref(text: str) -> ArtifactRef:
    ref: ArtifactRef = ARTIFACT_REF.decode(json.loads(text))
    return ref


def _as_scope(scope: Any) -> ArtifactScope | None:
    if scope is None or isinstance(scope, ArtifactScope):
        return scope
    return ArtifactScope.model_validate(ARTIFACT_SCOPE.encode(scope, "scope"))


__all__ = [
    "ArtifactLimitError",
    "ArtifactPut",
    "ArtifactTooLargeError",
    "CheckedArtifactPuts",
    "GroupLimit",
    "InMemoryArtifactStore",
    "artifact_id",
    "checked_artifact_bytes",
    "new_artifact_ref",
    "plan_evictions",
    "prepare_artifact_put",
    "ref_groups",
    "sanitize_artifact_namespace",
]
