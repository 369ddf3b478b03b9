"""An :class:`~guarded.models.ArtifactStore` on Redis, with PenguiFlow's retention rules
(``ArtifactRetentionConfig``), as the in-memory reference keeps them
(:class:`guarded.backend.InMemoryArtifactStore`):

* ids are content-addressed (``{namespace or 'art'}_{sha256[:12]}``); the same content under the
  same namespace returns the stored ref and refreshes its TTL;
* an artifact lives ``ttl_seconds`` (``<= 0``: the store's ``artifact_ttl``, never unbounded);
* ``max_artifact_bytes``: a larger artifact is refused before any I/O;
* per session and per trace (artifacts without one form a group of their own),
  ``max_artifacts_per_*`` and ``max_*_bytes``: a put that would exceed one evicts the group's least
  recently used (``lru``) or oldest (``fifo``) artifacts, or is refused (``none``).

Keys: the artifact ``{a.<id>}:artifact`` (a hash: ref, data, size, session, trace); each group's
index ``{s.<session>}:artifacts:session`` / ``{t.<trace>}:artifacts:trace`` (a sorted set in use or
insertion order, and a hash of sizes beside it); ``{artifacts}:all``, every artifact in insertion
order (``list()``). An artifact and its groups are in different slots: a put checks the groups,
evicts, then writes the artifact and its indexes, each step atomic in its slot. Concurrent puts
into one group from several processes may overshoot a limit by the puts in flight (the PostgreSQL
store's advisory locks have no cluster-wide equivalent here); the next put evicts back under it.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any, Protocol

from guarded.backend import (
    ArtifactPut,
    CheckedArtifactPuts,
    GroupLimit,
    next_logical_time,
    plan_evictions,
    ref_groups,
)
from guarded.codec import ARTIFACT_REF, ARTIFACT_SCOPE, RecordTypes, parse_json, refusing, text_argument
from guarded.errors import InvalidPayloadError
from guarded.models import ArtifactRetentionConfig

from .redis_keys import KeyLayout
from .redis_options import RedisSettings
from .redis_records import decoded, dumps


class ArtifactHost(Protocol):
    """What the artifact store uses of its state store (:class:`~.redis_store.RedisStateStore`)."""

    keys: KeyLayout
    settings: RedisSettings
    types: RecordTypes

    @property
    def client(self) -> Any: ...

    async def run(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any: ...

    async def acknowledged(self, *commands: Sequence[Any]) -> list[Any]: ...


GROUPS = ("session", "trace")


class RedisArtifactStore(CheckedArtifactPuts[ArtifactPut]):
    """Artifacts of one :class:`~.redis_store.RedisStateStore` (its ``artifact_store``)."""

    def __init__(self, store: ArtifactHost, retention: ArtifactRetentionConfig | None = None) -> None:
        self._store = store
        self._retention = retention or ArtifactRetentionConfig()

    @property
    def retention(self) -> ArtifactRetentionConfig:
        """The retention limits in force."""
        return self._retention

    def _ttl_ms(self) -> int:
        seconds = self._retention.ttl_seconds
        if seconds is not None and seconds > 0:
            return max(1, round(seconds * 1000))
        return self._store.settings.ms("artifact_ttl")

    def _group_keys(self, group: str, key: str | None) -> tuple[str, str]:
        index = self._store.keys.artifacts_of(group, key)
        return index, index + ":sizes"

    # -- writes -----------------------------------------------------------------------------------

    def _prepared(self, put: ArtifactPut, mime_type: str | None) -> ArtifactPut:
        return put

    async def _write(self, prepared: ArtifactPut) -> Any:
        return await self._put(prepared.data, prepared.ref, prepared.groups)

    async def _put(self, data: bytes, ref: dict[str, Any], groups: tuple[GroupLimit, GroupLimit]) -> Any:
        keys = self._store.keys
        ttl = self._ttl_ms()
        record = keys.artifact(ref["id"])
        existing = await self._store.run("artifact_touch", [record], [ttl])
        if existing:
            await self._use(ref["id"], groups, ttl)
            return self._decode_ref(existing)
        members = {
            group.group: await self._members(group)
            for group in groups
            if group.max_count > 0 or group.max_bytes > 0
        }
        victims = plan_evictions(
            groups,
            lambda group: members.get(group.group, []),
            len(data),
            self._retention.cleanup_strategy,
        )
        for victim in victims:
            await self._remove(victim)
        ref_text = dumps(ref, 2**62)
        order = next_logical_time()

        artifact_id = ref["id"]
        await self._store.acknowledged(
            ("HSET", record, "ref", ref_text, "data", data, "size", len(data)), ("PEXPIRE", record, ttl)
        )
        for group in groups:
            index, sizes = self._group_keys(group.group, group.key)
            await self._store.acknowledged(
                ("ZADD", index, order, artifact_id),
                ("HSET", sizes, artifact_id, len(data)),
                ("PEXPIRE", index, ttl),
                ("PEXPIRE", sizes, ttl),
            )
        everything = keys.all_artifacts()
        await self._store.acknowledged(("ZADD", everything, order, artifact_id), ("PEXPIRE", everything, ttl))
        return self._decode_ref(ref_text)

    async def _members(self, group: GroupLimit) -> list[tuple[str, int]]:
        """The group's live artifacts as ``(id, size)`` in the strategy's order (an expired one is
        dropped from the index)."""
        index, sizes = self._group_keys(group.group, group.key)
        client = self._store.client
        ids = [decoded(member) for member in await client.zrange(index, 0, -1)]
        if not ids:
            return []
        pipe = client.pipeline(transaction=False)
        for artifact_id in ids:
            pipe.exists(self._store.keys.artifact(artifact_id))
        alive = await pipe.execute()
        sized = await client.hmget(sizes, ids)
        gone = [artifact_id for artifact_id, live in zip(ids, alive, strict=True) if not live]
        if gone:
            await self._store.acknowledged(("ZREM", index, *gone), ("HDEL", sizes, *gone))
        return [
            (artifact_id, int(size or 0))
            for artifact_id, live, size in zip(ids, alive, sized, strict=True)
            if live
        ]

    async def _use(self, artifact_id: str, groups: tuple[GroupLimit, ...], ttl: int) -> None:
        """Count a use of the artifact (``lru``: it moves to the end of its groups)."""
        if self._retention.cleanup_strategy != "lru":
            return
        order = next_logical_time()
        for group in groups:
            index, _ = self._group_keys(group.group, group.key)
            await self._store.acknowledged(("ZADD", index, "XX", order, artifact_id))

    def _groups_of(self, ref_text: Any) -> tuple[GroupLimit, GroupLimit]:
        session, trace = ref_groups(parse_json(ref_text))
        return GroupLimit.session(session, self._retention), GroupLimit.trace(trace, self._retention)

    async def _remove(self, artifact_id: str) -> bool:
        """Delete the artifact and drop it from its indexes; whether it was stored."""
        record = self._store.keys.artifact(artifact_id)
        ref_text, deleted = await self._store.acknowledged(("HGET", record, "ref"), ("DEL", record))
        if ref_text is not None:
            for group in self._groups_of(ref_text):
                index, sizes = self._group_keys(group.group, group.key)
                await self._store.acknowledged(("ZREM", index, artifact_id), ("HDEL", sizes, artifact_id))
        everything = self._store.keys.all_artifacts()
        await self._store.acknowledged(("ZREM", everything, artifact_id))
        return bool(deleted)

    # -- reads ------------------------------------------------------------------------------------

    async def get(self, artifact_id: str) -> bytes | None:
        """The artifact's bytes, or ``None`` when missing or expired; counts as use for ``lru``."""
        with refusing("artifact_store.get"):
            key = text_argument(artifact_id, "artifact_id")
        data, ref_text = await self._store.client.hmget(self._store.keys.artifact(key), "data", "ref")
        if data is None:
            return None
        await self._use(key, self._groups_of(ref_text), self._ttl_ms())
        return bytes(data) if not isinstance(data, str) else data.encode("utf-8")

    async def get_ref(self, artifact_id: str) -> Any:
        """The artifact's ref, or ``None`` when missing or expired."""
        with refusing("artifact_store.get_ref"):
            key = text_argument(artifact_id, "artifact_id")
        found = await self._store.client.hget(self._store.keys.artifact(key), "ref")
        return None if found is None else self._decode_ref(found)

    async def delete(self, artifact_id: str) -> bool:
        """Delete the artifact; ``False`` when it was missing or already expired."""
        with refusing("artifact_store.delete"):
            key = text_argument(artifact_id, "artifact_id")
        return await self._remove(key)

    async def exists(self, artifact_id: str) -> bool:
        """Whether the artifact is stored and not expired."""
        with refusing("artifact_store.exists"):
            key = text_argument(artifact_id, "artifact_id")
        return bool(await self._store.client.exists(self._store.keys.artifact(key)))

    async def list(self, *, scope: Any = None) -> builtins.list[Any]:
        """Refs of live artifacts in insertion order; ``scope``'s non-``None`` fields must all match."""
        wanted: dict[str, Any] = {}
        if scope is not None:
            try:
                wanted = {
                    name: value for name, value in ARTIFACT_SCOPE.encode(scope).items() if value is not None
                }
            except InvalidPayloadError as exc:
                raise exc.at("scope").for_method("artifact_store.list") from None
        client, keys = self._store.client, self._store.keys
        if "session_id" in wanted:
            index = keys.artifacts_of("session", str(wanted["session_id"]))
        elif "trace_id" in wanted:
            index = keys.artifacts_of("trace", str(wanted["trace_id"]))
        else:
            index = keys.all_artifacts()
        ids = [decoded(member) for member in await client.zrange(index, 0, -1)]
        if not ids:
            return []
        pipe = client.pipeline(transaction=False)
        for artifact_id in ids:
            pipe.hmget(keys.artifact(artifact_id), "ref")
        found = []
        for (ref_text,) in await pipe.execute():
            if ref_text is None:
                continue
            data = parse_json(ref_text)
            ref_scope = data.get("scope") or {}
            if all(ref_scope.get(name) == value for name, value in wanted.items()):
                found.append(data)
        found.sort(key=lambda data: ids.index(data["id"]))
        return [ARTIFACT_REF.decode(data, self._store.types) for data in found]

    def _decode_ref(self, ref_text: Any) -> Any:
        return ARTIFACT_REF.decode(parse_json(ref_text), self._store.types)


__all__ = ["GROUPS", "ArtifactHost", "RedisArtifactStore"]
