"""``RedisStateStore``: the whole StateStore protocol on Redis (redis-py's asyncio client), on a
single node or a Redis Cluster, with plain Redis 6.2+ / Valkey commands only (no modules).

::

    store = await RedisStateStore.connect("redis://localhost:6379/0", prefix="tenant-a")
    store = await RedisStateStore.connect("redis://node1:7000", cluster=True)
    store = RedisStateStore(client, prefix="tenant-a")       # your redis.asyncio client
    await store.close()

**Keys** (:mod:`.redis_keys`): ``<prefix>:{<tag>}:<kind>``, one hash tag per session, trace,
token, task or artifact; every script and multi-key command of one call stays in one tag, so a
cluster never answers ``CROSSSLOT``. A caller's id is escaped, never interpreted. Every key has
the time to live of its class (:class:`~.redis_options.RedisSettings`), refreshed by its writes.

**Last-write-wins** (memory, trajectories, remote bindings, pauses) is enforced on the server, in
one Lua script per tag (:mod:`.redis_scripts`): a direct write is applied with ``max(its time,
the stored time + 1)``; a replay replaces the record only when not older, else the store raises
:class:`~guarded.errors.WriteSupersededError`; every stored time goes to ``merge_logical_time``.
A task never goes back to an older ``updated_at``.

**Appends** (runtime events, updates, steering, planner events) are Streams: an item is appended
once (a script checks its idempotency record -- the event's fingerprint, the item's id, the
planner event's call key -- and ``XADD`` s in one step), listed in insertion order, and the
``since_id`` cursor of updates and steering is resolved to the stream entry of that id.

**Pauses** are consumed once (:mod:`lua/pause_take.lua`): with the guard's idempotency key a
consume marks the pause consumed by that key and answers a retry with the same key within
``consume_grace``; it recovers a pause consumed by one of the guard's unanswered keys; the consumed
record stays as the token's tombstone for the pause TTL, so no replay of an older save revives it.

**Lists across tags** (a session's tasks, traces and bindings, whose records live under their own
task or trace tag) are read from the session's index and then the records, in one pipeline; a
record moved away or expired is left out. A task or binding that moves to another session is
written in two steps (its record, then the indexes): a failure between them raises, and the guard's
retry or replay writes both again.

Everything a method raises besides :class:`~guarded.errors.InvalidPayloadError` (bad data,
refused before any I/O) comes from redis-py and is for the guard to classify
(:mod:`.redis_errors`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from datetime import datetime
from time import time as wall_clock
from types import TracebackType
from typing import Any, Self, TypeVar

from prometheus_client import CollectorRegistry
from redis import asyncio as redis_asyncio
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from guarded.backend import (
    LOGICAL_TIMES,
    current_idempotency_key,
    current_item_keys,
    current_logical_time,
    current_logical_times,
    current_unanswered_keys,
    is_replay,
    merge_logical_time,
    next_logical_time,
    sanitize_steering_event,
    ttl_left,
)
from guarded.codec import (
    PLANNER_EVENT,
    REMOTE_BINDING,
    STATE_UPDATE,
    STEERING_EVENT,
    STORED_EVENT,
    TASK_STATE,
    RecordCodec,
    RecordTypes,
    decode_trajectory,
    encode_trajectory,
    event_fingerprint_and_text,
    installed_types,
    parse_json,
    refusing,
)
from guarded.codec import float_argument as finite
from guarded.codec import optional_text_argument as optional_text
from guarded.codec import text_argument as text
from guarded.errors import InvalidPayloadError, WriteSupersededError
from guarded.models import GLOBAL_TRACE_ID, ArtifactRetentionConfig

from .redis_artifacts import RedisArtifactStore
from .redis_errors import REDIS_ERRORS, ReplicasNotAcknowledgedError
from .redis_keys import KeyLayout, check_prefix, memory_group
from .redis_node_sampler import DEFAULT_SAMPLE_INTERVAL_SECONDS, StoreSampling
from .redis_options import SETTING_NAMES, RedisSettings, check_settings
from .redis_records import (
    decoded,
    dumps,
    grouped,
    items_of,
    micros,
    object_text,
    record_text,
    within,
)
from .redis_scripts import Scripts

_Item = TypeVar("_Item")

DEFAULT_PREFIX = "guarded"
DEFAULT_MAX_CONNECTIONS = 32
_IN_MILLISECONDS = ("pause_ttl", "memory_ttl", "session_ttl", "trace_ttl", "ack_timeout")
"""The settings the store sends to Redis in milliseconds (:meth:`RedisSettings.ms`)."""


def _refused(results: Sequence[Any]) -> int:
    """How many items a last-write-wins script refused, from its reply (per item: applied 1/0, the
    record's time); every stored time goes to ``merge_logical_time``."""
    refused = newest = 0
    for index in range(0, len(results), 2):
        if not int(results[index]):
            refused += 1
        stored = results[index + 1]
        if stored and int(stored) > newest:
            newest = int(stored)
    if newest:
        merge_logical_time(newest)
    return refused


def _superseded(refused: int, method: str) -> None:
    if refused:
        raise WriteSupersededError(refused, method=method)


class RedisStateStore:
    """A production StateStore on Redis or Redis Cluster (see the module docs)."""

    honours_idempotency_key = True
    """A consume is safe to retry under one idempotency key: the guard retries it."""
    recovers_unanswered_consumes = True
    """A consume recovers a pause consumed by a key whose answer was lost (``lua/pause_take.lua``)."""
    error_classifier = REDIS_ERRORS
    """How the guard classifies redis-py's errors (:mod:`.redis_errors`)."""
    db_system_name = "redis"
    """OpenTelemetry's ``db.system.name`` of the guard's spans."""
    durable_across_processes = True

    def __init__(
        self,
        client: Any,
        *,
        prefix: str = DEFAULT_PREFIX,
        name: str = "redis",
        types: RecordTypes | None = None,
        owns_client: bool = False,
        settings: RedisSettings | None = None,
        artifact_retention: ArtifactRetentionConfig | None = None,
        registry: CollectorRegistry | None = None,
        metrics: bool = True,
        sample_interval: float | None = DEFAULT_SAMPLE_INTERVAL_SECONDS,
        **options: Any,
    ) -> None:
        """A store on ``client`` (``redis.asyncio.Redis`` or ``redis.asyncio.cluster.RedisCluster``),
        its keys under ``prefix``. ``settings`` or keyword arguments named as
        :class:`~.redis_options.RedisSettings`' fields (``pause_ttl=600``, ``replicas_to_ack=1``);
        ``owns_client``: :meth:`close` closes the client; ``artifact_retention``: the limits of
        :attr:`artifact_store`. The client must not decode responses (redis-py's default):
        artifacts are bytes. Metrics (:mod:`.redis_metrics`) go to ``registry`` (the default
        Prometheus registry when ``None``; ``metrics=False``: none); every node is sampled each
        ``sample_interval`` seconds (``None``: not sampled) from the first running event loop."""
        if _decodes_responses(client):
            raise ValueError("RedisStateStore reads bytes: create the client with decode_responses=False")
        unknown = sorted(set(options) - set(SETTING_NAMES))
        if unknown:
            raise TypeError(f"RedisStateStore() got unknown options {unknown}; known: {list(SETTING_NAMES)}")
        base = settings or RedisSettings()
        if options:
            base = RedisSettings(**{**{field: getattr(base, field) for field in SETTING_NAMES}, **options})
        self.settings = check_settings(base)
        self.keys = KeyLayout(check_prefix(prefix))
        self.prefix = prefix
        self.name = name
        self.types = types or installed_types()
        self._client = client
        self._owns_client = owns_client
        self._scripts = Scripts.on(client)
        self.is_cluster = isinstance(client, RedisCluster)
        self.target_identity = _target_identity(client, prefix)
        """Which server (or cluster) and key prefix this store writes to, without credentials."""
        self.max_concurrency: int | None = _pool_size(client)
        """How many calls the store runs at once: its connection pool's size when bounded."""
        self._artifacts = RedisArtifactStore(self, artifact_retention)
        self.sampling = StoreSampling(
            client, store=name, registry=registry, metrics=metrics, interval=sample_interval
        )
        """The store's metrics and node sampler (:mod:`.redis_node_sampler`)."""

    # ------------------------------------------------------------------------------------------------
    # Lifecycle
    # ------------------------------------------------------------------------------------------------

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        cluster: bool = False,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        socket_timeout: float | None = 10.0,
        client_options: dict[str, Any] | None = None,
        **options: Any,
    ) -> Self:
        """A store on a new client for ``url`` (``redis://`` or ``rediss://``; ``cluster=True``: a
        Redis Cluster reached through that node), closed by :meth:`close`. The connection pool
        holds ``max_connections`` (calls wait for a free one), which is also the store's
        ``max_concurrency``; the server is pinged before the store is returned."""
        extra = dict(client_options or {})
        extra.setdefault("socket_timeout", socket_timeout)
        extra.setdefault("socket_connect_timeout", socket_timeout)
        client: Any
        if cluster:
            client = RedisCluster.from_url(
                url, decode_responses=False, max_connections=max_connections, **extra
            )
        else:
            pool = redis_asyncio.BlockingConnectionPool.from_url(
                url, decode_responses=False, max_connections=max_connections, timeout=socket_timeout, **extra
            )
            client = redis_asyncio.Redis.from_pool(pool)
        try:
            store = cls(client, owns_client=True, **options)
            store.max_concurrency = max_connections
            await client.ping()
            store.sampling.start()
        except BaseException:
            await client.aclose()
            raise
        return store

    @property
    def settings(self) -> RedisSettings:
        """What the store runs with (its times in milliseconds are worked out when it is set)."""
        return self._settings

    @settings.setter
    def settings(self, settings: RedisSettings) -> None:
        self._settings = settings
        self._ms = {name: settings.ms(name) for name in _IN_MILLISECONDS}

    @property
    def client(self) -> Any:
        """The redis-py client (for operators' tools)."""
        return self._client

    async def close(self) -> None:
        """Stop sampling, drop the metrics and close the client when the store made it (:meth:`connect`)."""
        await self.sampling.close()
        if self._owns_client:
            await self._client.aclose()

    async def drop_everything(self) -> int:
        """Delete every key under the store's prefix (``SCAN`` of ``<prefix>:*``, then ``UNLINK`` key by
        key: on a cluster they are in many slots); how many were deleted. For scratch prefixes and
        tests: the data of the prefix is gone."""
        deleted = 0
        async for key in self._client.scan_iter(match=self.keys.everything(), count=1000):
            deleted += int(await self._client.unlink(key))
        return deleted

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"RedisStateStore(name={self.name!r}, prefix={self.prefix!r})"

    @property
    def artifact_store(self) -> RedisArtifactStore:
        """Artifacts under this store's prefix (:mod:`.redis_artifacts`)."""
        return self._artifacts

    # ------------------------------------------------------------------------------------------------
    # Running scripts
    # ------------------------------------------------------------------------------------------------

    async def run(self, script: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run a write script on the keys of one tag; with ``replicas_to_ack`` wait (``WAIT``, on the
        same connection) until that many replicas have it, else
        :class:`~.redis_errors.ReplicasNotAcknowledgedError`."""
        registered = self._scripts.by_name[script]
        wanted = self._settings.replicas_to_ack
        if not wanted:
            # Awaited here, not through _loading_script: the usual call pays for no further coroutine
            # or closure; a server without the script (NOSCRIPT) is recovered below.
            try:
                return await self._evalsha(registered, keys, args)
            except NoScriptError:
                pass
            except Exception as exc:
                self.sampling.command_failed(exc)
                raise
        try:
            if not wanted:
                return await self._loading_script(registered, lambda: self._evalsha(registered, keys, args))
            result, acknowledged = await self._loading_script(
                registered, lambda: self._run_then_wait(registered, keys, args)
            )
        except Exception as exc:
            self.sampling.command_failed(exc)
            raise
        if int(acknowledged) < wanted:
            raise ReplicasNotAcknowledgedError(wanted, int(acknowledged))
        return result

    def _evalsha(self, registered: Any, keys: Sequence[str], args: Sequence[Any]) -> Awaitable[Any]:
        """``EVALSHA`` of a registered script straight from the client: redis-py's
        ``Script.__call__`` costs more than the call."""
        return self._client.execute_command("EVALSHA", registered.sha, len(keys), *keys, *args)  # type: ignore[no-any-return]

    async def _loading_script(self, registered: Any, attempt: Callable[[], Awaitable[Any]]) -> Any:
        """``attempt()``, once more after loading ``registered`` when the server lacks it: a restarted
        server or a promoted replica starts with an empty script cache, and redis-py's cluster
        pipeline never loads a script the node lacks (loaded on every master of a cluster)."""
        try:
            return await attempt()
        except NoScriptError:
            registered.sha = await self._client.script_load(registered.script)
            return await attempt()

    async def _run_then_wait(self, registered: Any, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
        """The script's reply and how many replicas acknowledged it (one pipeline, one connection)."""
        pipe = self._client.pipeline(transaction=False)
        await registered(keys=list(keys), args=list(args), client=pipe)
        pipe.execute_command("WAIT", self._settings.replicas_to_ack, self._ms["ack_timeout"])
        replies: list[Any] = await pipe.execute()
        return replies

    async def acknowledged(self, *commands: Sequence[Any]) -> list[Any]:
        """Run plain commands (``("ZREM", key, member)``) on keys of one tag in one pipeline and,
        with ``replicas_to_ack``, ``WAIT`` for the replicas on the same connection; their replies."""
        wanted = self._settings.replicas_to_ack
        if len(commands) == 1 and not wanted:  # one command needs no pipeline
            return [await self._client.execute_command(*commands[0])]
        pipe = self._client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        if wanted:
            pipe.execute_command("WAIT", wanted, self._ms["ack_timeout"])
        replies: list[Any] = await pipe.execute()
        if wanted:
            acknowledged = int(replies.pop())
            if acknowledged < wanted:
                raise ReplicasNotAcknowledgedError(wanted, acknowledged)
        return replies

    async def _each(
        self,
        items: Sequence[_Item],
        tag_of: Callable[[_Item], Hashable],
        call: Callable[[list[_Item]], Awaitable[Any]],
    ) -> list[Any]:
        """``call(group)`` for the items of each tag (:func:`~.redis_records.grouped`), awaited together
        (they touch distinct slots); their results. A single item is its own group."""
        if len(items) == 1:
            return [await call(list(items))]
        return list(await asyncio.gather(*[call(group) for group in grouped(items, tag_of)]))

    def _times(self, count: int) -> Sequence[int]:
        return current_logical_times(count)

    async def _index(self, key: str, ttl_ms: int, scored: Sequence[tuple[float, str]], *, keep: bool) -> None:
        """Add ``(score, member)`` pairs to a sorted-set index (``keep``: a member keeps its score)."""
        if not scored:
            return
        args: list[Any] = [ttl_ms, "nx" if keep else "set"]
        for score, member in scored:
            args += [score, member]
        await self.run("index_add", [key], args)

    # ------------------------------------------------------------------------------------------------
    # Runtime events
    # ------------------------------------------------------------------------------------------------

    def _encode_event(self, event: Any) -> tuple[str, str, float, str]:
        """``(trace_id, fingerprint, ts, doc)`` of a runtime event."""
        for name in ("trace_id", "kind", "node_name", "node_id"):
            if not hasattr(event, name):
                raise InvalidPayloadError(f"{type(event).__name__} has no attribute {name!r}", path=name)
        trace_id = optional_text(event.trace_id, "trace_id") or GLOBAL_TRACE_ID
        ts = finite(getattr(event, "ts", None), "ts")
        text(event.kind, "kind")
        optional_text(event.node_name, "node_name")
        optional_text(event.node_id, "node_id")
        doc = STORED_EVENT.encode(event)  # its JSON text, checked for size, is written below
        doc["trace_id"] = trace_id
        doc["ts"] = ts
        fingerprint, encoded = event_fingerprint_and_text(doc)
        return trace_id, fingerprint, ts, within(encoded, self._settings.max_value_bytes)

    async def save_event(self, event: Any) -> None:
        """Append a runtime event to its trace; a repeat (same trace, ts, kind, node, payload) is not."""
        with refusing("save_event", "event"):
            row = self._encode_event(event)
        await self._append_events([row])

    async def save_events(self, events: Sequence[Any]) -> None:
        """:meth:`save_event` for each event, one script per trace; nothing is written if one is bad."""
        rows = []
        for index, event in enumerate(events):
            with refusing("save_events", f"events[{index}]"):
                rows.append(self._encode_event(event))
        await self._append_events(rows)

    async def _append_events(self, rows: Sequence[tuple[str, str, float, str]]) -> None:
        ttl = self._ms["trace_ttl"]

        def append(group: list[tuple[str, str, float, str]]) -> Awaitable[Any]:
            args: list[Any] = [ttl]
            for _, fingerprint, ts, doc in group:
                args += [fingerprint, repr(ts), doc]
            return self.run("events_append", self.keys.events(group[0][0]), args)

        await self._each(rows, lambda row: row[0], append)

    async def load_history(self, trace_id: str) -> list[Any]:
        """The trace's events by ascending ``ts``, ties in insertion order; ``[]`` when unknown."""
        with refusing("load_history"):
            trace = text(trace_id, "trace_id")
        stream, _ = self.keys.events(trace)
        entries = await self._client.xrange(stream)
        rows = sorted(
            ((float(fields["ts"]), index, fields["d"]) for index, (_, fields) in enumerate(_entries(entries)))
        )
        return [_decode(STORED_EVENT, parse_json(doc), self.types) for _, _, doc in rows]

    # ------------------------------------------------------------------------------------------------
    # Remote bindings
    # ------------------------------------------------------------------------------------------------

    def _encode_binding(self, binding: Any) -> tuple[str, str | None, str, str, str | None, str]:
        """``(trace_id, context_id, task_id, doc, router_session_id, terminal)`` of a binding."""
        doc, encoded = record_text(lambda: REMOTE_BINDING.encode(binding), self._settings.max_value_bytes, "")
        router = doc.get("router_session_id")
        context = doc.get("context_id")
        return (
            str(doc["trace_id"]),
            context if isinstance(context, str) else None,
            str(doc["task_id"]),
            encoded,
            router if isinstance(router, str) else None,
            "1" if doc.get("is_terminal") else "0",
        )

    async def save_remote_binding(self, binding: Any) -> None:
        """Upsert the binding on ``(trace_id, context_id, task_id)``."""
        with refusing("save_remote_binding", "binding"):
            row = self._encode_binding(binding)
        await self._save_bindings("save_remote_binding", [row])

    async def save_remote_bindings(self, bindings: Sequence[Any]) -> None:
        """:meth:`save_remote_binding` for each binding in order; nothing is written if one is bad."""
        rows = []
        for index, binding in enumerate(bindings):
            with refusing("save_remote_bindings", f"bindings[{index}]"):
                rows.append(self._encode_binding(binding))
        await self._save_bindings("save_remote_bindings", rows)

    async def _save_bindings(
        self, method: str, rows: Sequence[tuple[str, str | None, str, str, str | None, str]]
    ) -> None:
        if not rows:
            return
        times = self._times(len(rows))
        replay = is_replay()
        ttl = self._ms["trace_ttl"]
        session_ttl = self._ms["session_ttl"]
        items = [(row, time, next_logical_time()) for row, time in zip(rows, times, strict=True)]

        async def save(
            group: list[tuple[tuple[str, str | None, str, str, str | None, str], int, int]],
        ) -> int:
            keys = [self.keys.binding(row[0], row[1], row[2]) for row, _, _ in group]
            args: list[Any] = ["1" if replay else "0", ttl]
            for row, time, saved in group:
                args += [time, row[3], row[5], "" if row[4] is None else "v" + row[4], saved]
            results = await self.run("binding_save", keys, args)
            refused = 0
            for (row, _, saved), (applied, stored, before, first) in zip(group, results, strict=True):
                if stored is not None:
                    merge_logical_time(int(stored))
                if not int(applied):
                    refused += 1
                    continue
                member = self.keys.binding_member(row[0], row[1], row[2])
                before_text = decoded(before)
                if before_text and before_text[1:] != row[4]:
                    first_index, saved_index = self.keys.bindings_of(before_text[1:])
                    await self.acknowledged(("ZREM", first_index, member), ("ZREM", saved_index, member))
                if row[4] is not None:
                    first_index, saved_index = self.keys.bindings_of(row[4])
                    await self._index(first_index, session_ttl, [(float(decoded(first)), member)], keep=True)
                    await self._index(saved_index, session_ttl, [(float(saved), member)], keep=False)
            return refused

        refused = await self._each(items, lambda item: item[0][0], save)
        _superseded(sum(refused), method)

    async def _bindings_indexed(
        self, index: str, router_session_id: str, *, newest_first: bool
    ) -> list[tuple[dict[str, Any], bool]]:
        """The bindings an index of the router session names that are still saved under it."""
        members = await (
            self._client.zrevrange(index, 0, -1) if newest_first else self._client.zrange(index, 0, -1)
        )
        if not members:
            return []
        pipe = self._client.pipeline(transaction=False)
        for member in members:
            pipe.hmget(self.keys.binding_of_member(decoded(member)), "doc", "terminal", "router")
        found = []
        for doc, terminal, router in await pipe.execute():
            if doc is None or decoded(router) != "v" + router_session_id:
                continue
            found.append((parse_json(doc), decoded(terminal) == "1"))
        return found

    def _binding(self, data: dict[str, Any], terminal: bool) -> Any:
        return REMOTE_BINDING.decode({**data, "is_terminal": terminal}, self.types)

    async def find_binding(
        self,
        *,
        router_session_id: str,
        agent_url: str,
        remote_skill: str,
        tenant_id: str | None = None,
        user_id: str | None = None,
    ) -> Any:
        """The most recently saved non-terminal binding with these coordinates, or ``None``."""
        with refusing("find_binding"):
            session = text(router_session_id, "router_session_id")
            wanted = {
                "agent_url": text(agent_url, "agent_url"),
                "remote_skill": text(remote_skill, "remote_skill"),
                "tenant_id": optional_text(tenant_id, "tenant_id"),
                "user_id": optional_text(user_id, "user_id"),
            }
        _, saved_index = self.keys.bindings_of(session)
        for data, terminal in await self._bindings_indexed(saved_index, session, newest_first=True):
            if not terminal and all(data.get(name) == value for name, value in wanted.items()):
                return self._binding(data, terminal)
        return None

    async def list_bindings(self, *, router_session_id: str) -> list[Any]:
        """Every binding of a router session, in the order first saved."""
        with refusing("list_bindings"):
            session = text(router_session_id, "router_session_id")
        first_index, _ = self.keys.bindings_of(session)
        return [
            self._binding(data, terminal)
            for data, terminal in await self._bindings_indexed(first_index, session, newest_first=False)
        ]

    async def mark_binding_terminal(self, *, trace_id: str, context_id: str | None, task_id: str) -> None:
        """Mark a binding terminal (never reused); a no-op for an unknown binding."""
        with refusing("mark_binding_terminal"):
            key = (
                text(trace_id, "trace_id"),
                optional_text(context_id, "context_id"),
                text(task_id, "task_id"),
            )
        await self._mark("mark_binding_terminal", [key])

    async def mark_bindings_terminal(self, items: Sequence[tuple[str, str | None, str]]) -> None:
        """:meth:`mark_binding_terminal` for each ``(trace_id, context_id, task_id)``."""
        keys = []
        with refusing("mark_bindings_terminal"):
            for index, (trace_id, context_id, task_id) in enumerate(
                items_of("mark_bindings_terminal", items, 3, "(trace_id, context_id, task_id)")
            ):
                try:
                    keys.append(
                        (
                            text(trace_id, "trace_id"),
                            optional_text(context_id, "context_id"),
                            text(task_id, "task_id"),
                        )
                    )
                except InvalidPayloadError as exc:
                    raise exc.at(f"items[{index}]") from None
        await self._mark("mark_bindings_terminal", keys)

    async def _mark(self, method: str, keys: Sequence[tuple[str, str | None, str]]) -> None:
        if not keys:
            return
        times = self._times(len(keys))
        replay = "1" if is_replay() else "0"
        ttl = self._ms["trace_ttl"]

        async def mark(group: list[tuple[tuple[str, str | None, str], int]]) -> int:
            args: list[Any] = [replay, ttl, *(time for _, time in group)]
            return _refused(
                await self.run("binding_mark", [self.keys.binding(*key) for key, _ in group], args)
            )

        items = list(zip(keys, times, strict=True))
        refused = await self._each(items, lambda item: item[0][0], mark)
        _superseded(sum(refused), method)

    # ------------------------------------------------------------------------------------------------
    # Planner pauses
    # ------------------------------------------------------------------------------------------------

    async def save_planner_state(self, token: str, payload: dict[str, Any]) -> None:
        """Save a pause payload, consumable for ``pause_ttl`` seconds (a consumed token again)."""
        with refusing("save_planner_state"):
            row = (text(token, "token"), object_text(payload, self._settings.max_value_bytes, "payload"))
        await self._save_pauses("save_planner_state", [row])

    async def save_planner_states(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """:meth:`save_planner_state` for each ``(token, payload)`` (the last of a token wins)."""
        rows = []
        with refusing("save_planner_states"):
            for index, (token, payload) in enumerate(
                items_of("save_planner_states", items, 2, "(token, payload)")
            ):
                try:
                    rows.append(
                        (
                            text(token, "token"),
                            object_text(payload, self._settings.max_value_bytes, "payload"),
                        )
                    )
                except InvalidPayloadError as exc:
                    raise exc.at(f"items[{index}]") from None
        await self._save_pauses("save_planner_states", rows)

    async def _save_pauses(self, method: str, rows: Sequence[tuple[str, str]]) -> None:
        if not rows:
            return
        times = self._times(len(rows))
        replay = "1" if is_replay() else "0"
        ttl = self._settings.pause_ttl
        living = []
        for (token, payload), time in zip(rows, times, strict=True):
            left = ttl_left(ttl, time)
            if left > 0:
                living.append((token, payload, time, max(1, round(left * 1000))))

        async def save(group: list[tuple[str, str, int, int]]) -> int:
            args: list[Any] = [replay]
            for _, payload, time, left_ms in group:
                args += [time, left_ms, payload]
            return _refused(await self.run("pause_save", [self.keys.pause(group[0][0])] * len(group), args))

        refused = await self._each(living, lambda item: item[0], save)
        self.sampling.pauses_saved(len(living) - sum(refused))
        _superseded(sum(refused), method)

    async def load_planner_state(self, token: str) -> dict[str, Any] | None:
        """Consume the pause: its payload once, then ``None`` (a retry with the same idempotency key
        within ``consume_grace`` gets it again; see the module docs)."""
        with refusing("load_planner_state"):
            key = text(token, "token")
            consumer = current_idempotency_key()
            if consumer is not None:
                text(consumer, "idempotency_key")
            unanswered = [text(old, "unanswered key") for old in current_unanswered_keys()]
        saved_by = LOGICAL_TIMES.get()
        if consumer is None and saved_by is not None:
            mode, time = "held", saved_by[0]
        else:
            mode, time = ("plain" if consumer is None else "keyed"), current_logical_time()
        args = [
            mode,
            time,
            self._ms["pause_ttl"],
            round(self._settings.consume_grace * 1000),
            consumer or "",
            *unanswered,
        ]
        found = await self.run("pause_take", [self.keys.pause(key)], args)
        if found is None or found is False:
            return None
        self.sampling.pause_consumed()
        payload: dict[str, Any] = parse_json(found)
        return payload

    # ------------------------------------------------------------------------------------------------
    # Memory
    # ------------------------------------------------------------------------------------------------

    async def save_memory_state(self, key: str, state: dict[str, Any]) -> None:
        """Upsert the memory state of ``key``."""
        with refusing("save_memory_state"):
            row = (text(key, "key"), object_text(state, self._settings.max_value_bytes, "state"))
        await self._save_memory("save_memory_state", [row])

    async def save_memory_states(self, items: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """:meth:`save_memory_state` for each ``(key, state)`` (the last state of a key wins)."""
        rows = []
        with refusing("save_memory_states"):
            for index, (key, state) in enumerate(items_of("save_memory_states", items, 2, "(key, state)")):
                try:
                    rows.append(
                        (text(key, "key"), object_text(state, self._settings.max_value_bytes, "state"))
                    )
                except InvalidPayloadError as exc:
                    raise exc.at(f"items[{index}]") from None
        await self._save_memory("save_memory_states", rows)

    async def _save_memory(self, method: str, rows: Sequence[tuple[str, str]]) -> None:
        if not rows:
            return
        times = self._times(len(rows))
        replay = "1" if is_replay() else "0"
        ttl = self._ms["memory_ttl"]
        items = list(zip(rows, times, strict=True))

        async def save(group: list[tuple[tuple[str, str], int]]) -> int:
            keys: list[str] = [""]  # the index first, then a record per item
            args: list[Any] = [replay, ttl]
            for (key, state), time in group:
                record, keys[0] = self.keys.memory(key)
                keys.append(record)
                args += [time, key, state]
            return _refused(await self.run("memory_save", keys, args))

        refused = await self._each(items, lambda item: memory_group(item[0][0]), save)
        _superseded(sum(refused), method)

    async def load_memory_state(self, key: str) -> dict[str, Any] | None:
        """The exact state saved for ``key``, or ``None``."""
        with refusing("load_memory_state"):
            record, _ = self.keys.memory(text(key, "key"))
        found = await self._client.hget(record, "state")
        if found is None:
            return None
        state: dict[str, Any] = parse_json(found)
        return state

    async def list_memory_keys(self, session_id: str) -> list[str]:
        """Every memory key of the session, sorted: the keys ending with ``:{session_id}``."""
        with refusing("list_memory_keys"):
            session = text(session_id, "session_id")
        now_ms = wall_clock() * 1000
        members = await self._client.zrangebyscore(self.keys.memory_index(session), now_ms, "+inf")
        suffix = ":" + session
        return sorted(key for key in map(decoded, members) if key.endswith(suffix))

    # ------------------------------------------------------------------------------------------------
    # Tasks
    # ------------------------------------------------------------------------------------------------

    def _encode_task(self, state: Any) -> tuple[str, str, int, str]:
        """``(task_id, session_id, updated_at in µs, doc)`` of a task state."""
        doc, encoded = record_text(lambda: TASK_STATE.encode(state), self._settings.max_value_bytes, "")
        updated_at = getattr(state, "updated_at", None)
        if not isinstance(updated_at, datetime):
            raise InvalidPayloadError("expected a datetime", path="updated_at")
        return str(doc["task_id"]), str(doc["session_id"]), micros(updated_at), encoded

    async def save_task(self, state: Any) -> None:
        """Upsert a task unless the stored one has a newer ``updated_at``; a task saved under another
        session moves there."""
        with refusing("save_task", "state"):
            row = self._encode_task(state)
        await self._save_tasks("save_task", [row])

    async def save_tasks(self, states: Sequence[Any]) -> None:
        """:meth:`save_task` for each state in order; nothing is written if one is bad."""
        rows = []
        for index, state in enumerate(states):
            with refusing("save_tasks", f"states[{index}]"):
                rows.append(self._encode_task(state))
        await self._save_tasks("save_tasks", rows)

    async def _save_tasks(self, method: str, rows: Sequence[tuple[str, str, int, str]]) -> None:
        ttl = self._ms["session_ttl"]
        items = [(row, next_logical_time()) for row in rows]

        async def save(group: list[tuple[tuple[str, str, int, str], int]]) -> int:
            refused = 0
            for (task_id, session_id, updated, doc), order in group:
                keys, args = [self.keys.task(task_id)], [ttl, updated, session_id, doc]
                if not self.is_cluster:  # one script indexes it too: its keys need not share a slot
                    keys.append(self.keys.tasks_of(session_id))
                    args += [float(order), task_id]
                applied, had, before = await self.run("task_save", keys, args)
                if not int(applied):
                    refused += 1
                    continue
                previous = decoded(before) if int(had) else None
                if previous is not None and previous != session_id:
                    await self.acknowledged(("ZREM", self.keys.tasks_of(previous), task_id))
                if self.is_cluster:
                    await self._index(
                        self.keys.tasks_of(session_id),
                        ttl,
                        [(float(order), task_id)],
                        keep=previous == session_id,
                    )
            return refused

        refused = sum(await self._each(items, lambda item: item[0][0], save))
        if refused and is_replay():
            raise WriteSupersededError(refused, method=method)

    async def list_tasks(self, session_id: str) -> list[Any]:
        """Every task of the session, in the order first saved there; ``[]`` when none."""
        with refusing("list_tasks"):
            session = text(session_id, "session_id")
        members = await self._client.zrange(self.keys.tasks_of(session), 0, -1)
        if not members:
            return []
        pipe = self._client.pipeline(transaction=False)
        for member in members:
            pipe.hmget(self.keys.task(decoded(member)), "session", "doc")
        return [
            _decode(TASK_STATE, parse_json(doc), self.types)
            for stored_session, doc in await pipe.execute()
            if doc is not None and decoded(stored_session) == session
        ]

    # ------------------------------------------------------------------------------------------------
    # Updates and steering
    # ------------------------------------------------------------------------------------------------

    def _encode_item(self, codec: RecordCodec[Any], item: Any, id_field: str) -> tuple[str, str, str, str]:
        """``(session_id, item id, task_id, doc)`` of an update or a steering event."""
        doc, encoded = record_text(lambda: codec.encode(item), self._settings.max_value_bytes, "")
        return str(doc["session_id"]), str(doc[id_field]), str(doc["task_id"]), encoded

    async def _append(self, kind: str, rows: Sequence[tuple[str, str, str, str]]) -> None:
        ttl = self._ms["session_ttl"]

        def append(group: list[tuple[str, str, str, str]]) -> Awaitable[Any]:
            args: list[Any] = [ttl]
            for _, item_id, task_id, doc in group:
                args += [item_id, task_id, doc]
            return self.run("stream_append", self.keys.stream(kind, group[0][0]), args)

        await self._each(rows, lambda row: row[0], append)

    async def save_update(self, update: Any) -> None:
        """Append an update; idempotent by ``(session_id, update_id)``."""
        with refusing("save_update", "update"):
            row = self._encode_item(STATE_UPDATE, update, "update_id")
        await self._append("updates", [row])

    async def save_task_update(self, update: Any) -> None:
        """Legacy alias of :meth:`save_update`."""
        with refusing("save_task_update", "update"):
            row = self._encode_item(STATE_UPDATE, update, "update_id")
        await self._append("updates", [row])

    async def save_updates(self, updates: Sequence[Any]) -> None:
        """:meth:`save_update` for each update in order; nothing is written if one is bad."""
        rows = []
        for index, update in enumerate(updates):
            with refusing("save_updates", f"updates[{index}]"):
                rows.append(self._encode_item(STATE_UPDATE, update, "update_id"))
        await self._append("updates", rows)

    async def _list(
        self,
        method: str,
        kind: str,
        codec: RecordCodec[Any],
        session_id: Any,
        task_id: Any,
        since_id: Any,
        limit: Any,
    ) -> list[Any]:
        with refusing(method):
            session = text(session_id, "session_id")
            task = optional_text(task_id, "task_id")
            cursor = optional_text(since_id, "since_id") or None
            if isinstance(limit, bool) or not isinstance(limit, int):
                raise InvalidPayloadError(f"expected an integer, got {type(limit).__name__}", path="limit")
        stream, ids = self.keys.stream(kind, session)
        start = "-"
        if cursor is not None:
            entry = await self._client.hget(ids, cursor)
            if entry is not None:
                start = "(" + decoded(entry)
        if task is None and limit > 0:
            newest = await self._client.xrevrange(stream, "+", start, count=limit)
            entries = list(reversed(_entries(newest)))
        else:
            entries = _entries(await self._client.xrange(stream, start, "+"))
            if task is not None:
                entries = [entry for entry in entries if entry[1]["task"] == task]
            entries = entries[-limit:]
        return [_decode(codec, parse_json(fields["d"]), self.types) for _, fields in entries]

    async def list_updates(
        self, session_id: str, *, task_id: str | None = None, since_id: str | None = None, limit: int = 500
    ) -> list[Any]:
        """Updates oldest first after the exclusive cursor ``since_id``; the ``limit`` most recent."""
        return await self._list("list_updates", "updates", STATE_UPDATE, session_id, task_id, since_id, limit)

    async def list_task_updates(
        self, session_id: str, *, task_id: str | None = None, since_id: str | None = None, limit: int = 500
    ) -> list[Any]:
        """Legacy alias of :meth:`list_updates`."""
        return await self._list(
            "list_task_updates", "updates", STATE_UPDATE, session_id, task_id, since_id, limit
        )

    async def save_steering(self, event: Any) -> None:
        """Sanitize as PenguiFlow does, then append; idempotent by ``(session_id, event_id)``."""
        sanitized = sanitize_steering_event(event)
        with refusing("save_steering", "event"):
            row = self._encode_item(STEERING_EVENT, sanitized, "event_id")
        await self._append("steering", [row])

    async def list_steering(
        self, session_id: str, *, task_id: str | None = None, since_id: str | None = None, limit: int = 500
    ) -> list[Any]:
        """Steering events with :meth:`list_updates`' cursor rules."""
        return await self._list(
            "list_steering", "steering", STEERING_EVENT, session_id, task_id, since_id, limit
        )

    # ------------------------------------------------------------------------------------------------
    # Trajectories
    # ------------------------------------------------------------------------------------------------

    def _encode_trajectory(self, trace_id: Any, session_id: Any, trajectory: Any) -> tuple[str, str, str]:
        trace = text(trace_id, "trace_id")
        session = text(session_id, "session_id")
        try:
            doc = encode_trajectory(trajectory, "trajectory")
        except RecursionError:
            raise InvalidPayloadError("nested too deeply (a reference cycle?)", path="trajectory") from None
        return trace, session, dumps(doc, self._settings.max_value_bytes, "trajectory")

    async def save_trajectory(self, trace_id: str, session_id: str, trajectory: Any) -> None:
        """Upsert the trajectory of the trace; the trace becomes the session's most recent."""
        with refusing("save_trajectory"):
            row = self._encode_trajectory(trace_id, session_id, trajectory)
        await self._save_trajectories("save_trajectory", [row])

    async def save_trajectories(self, items: Sequence[tuple[str, str, Any]]) -> None:
        """:meth:`save_trajectory` for each ``(trace_id, session_id, trajectory)`` in order."""
        rows = []
        with refusing("save_trajectories"):
            for index, item in enumerate(
                items_of("save_trajectories", items, 3, "(trace_id, session_id, trajectory)")
            ):
                try:
                    rows.append(self._encode_trajectory(*item))
                except InvalidPayloadError as exc:
                    raise exc.at(f"items[{index}]") from None
        await self._save_trajectories("save_trajectories", rows)

    async def _save_trajectories(self, method: str, rows: Sequence[tuple[str, str, str]]) -> None:
        if not rows:
            return
        times = self._times(len(rows))
        replay = "1" if is_replay() else "0"
        ttl = self._ms["trace_ttl"]
        session_ttl = self._ms["session_ttl"]
        items = [(row, time, next_logical_time()) for row, time in zip(rows, times, strict=True)]

        async def save(group: list[tuple[tuple[str, str, str], int, int]]) -> int:
            args: list[Any] = [replay, ttl]
            for (_, session, doc), time, _ in group:
                args += [time, session, doc]
            results = await self.run("trajectory_save", [self.keys.trajectory(group[0][0][0])], args)
            stored = [int(value) for value in results[1::2] if value]
            if stored:
                merge_logical_time(max(stored))
            refused = 0
            for ((trace, session, _), _, order), applied in zip(group, results[0::2], strict=True):
                if int(applied):
                    await self._index(
                        self.keys.traces_of(session), session_ttl, [(float(order), trace)], keep=False
                    )
                else:
                    refused += 1
            return refused

        refused = await self._each(items, lambda item: item[0][0], save)
        _superseded(sum(refused), method)

    async def get_trajectory(self, trace_id: str, session_id: str) -> Any:
        """The trajectory, or ``None`` when missing or saved under another session."""
        with refusing("get_trajectory"):
            trace, session = text(trace_id, "trace_id"), text(session_id, "session_id")
        stored_session, doc = await self._client.hmget(self.keys.trajectory(trace), "session", "doc")
        if doc is None or decoded(stored_session) != session:
            return None
        return decode_trajectory(parse_json(doc))

    async def list_traces(self, session_id: str, limit: int = 50) -> list[str]:
        """Trace ids ever saved under the session, most recently saved there first (PenguiFlow's
        ``[:limit]``)."""
        with refusing("list_traces"):
            session = text(session_id, "session_id")
            if isinstance(limit, bool) or not isinstance(limit, int):
                raise InvalidPayloadError(f"expected an integer, got {type(limit).__name__}", path="limit")
        if limit == 0:
            return []
        end = limit - 1 if limit > 0 else -1
        traces = [
            decoded(member) for member in await self._client.zrevrange(self.keys.traces_of(session), 0, end)
        ]
        return traces if limit > 0 else traces[:limit]

    # ------------------------------------------------------------------------------------------------
    # Planner events
    # ------------------------------------------------------------------------------------------------

    def _encode_planner_event(self, trace_id: Any, event: Any) -> tuple[str, str]:
        trace = text(trace_id, "trace_id")
        _, doc = record_text(lambda: PLANNER_EVENT.encode(event), self._settings.max_value_bytes, "event")
        finite(parse_json(doc).get("ts"), "event.ts")
        return trace, doc

    async def save_planner_event(self, trace_id: str, event: Any) -> None:
        """Append a planner event (a retry under the same idempotency key is not appended twice)."""
        with refusing("save_planner_event"):
            row = self._encode_planner_event(trace_id, event)
        await self._append_planner([row])

    async def save_planner_events(self, items: Sequence[tuple[str, Any]]) -> None:
        """Append many ``(trace_id, event)`` pairs, in order."""
        rows = []
        with refusing("save_planner_events"):
            for index, (trace_id, event) in enumerate(
                items_of("save_planner_events", items, 2, "(trace_id, event)")
            ):
                try:
                    rows.append(self._encode_planner_event(trace_id, event))
                except InvalidPayloadError as exc:
                    raise exc.at(f"items[{index}]") from None
        await self._append_planner(rows)

    async def _append_planner(self, rows: Sequence[tuple[str, str]]) -> None:
        if not rows:
            return
        with refusing("save_planner_events"):
            keys = _call_keys(len(rows))
        ttl = self._ms["trace_ttl"]
        items = [(trace, doc, key) for (trace, doc), key in zip(rows, keys, strict=True)]

        def append(group: list[tuple[str, str, str]]) -> Awaitable[Any]:
            args: list[Any] = [ttl]
            for _, doc, key in group:
                args += [key, doc]
            return self.run("planner_append", self.keys.planner_events(group[0][0]), args)

        await self._each(items, lambda item: item[0], append)

    async def list_planner_events(self, trace_id: str) -> list[Any]:
        """Planner events of a trace in emission order."""
        return await self._planner_events("list_planner_events", trace_id)

    async def get_events(self, trace_id: str) -> list[Any]:
        """Legacy alias of :meth:`list_planner_events`."""
        return await self._planner_events("get_events", trace_id)

    async def _planner_events(self, method: str, trace_id: Any) -> list[Any]:
        with refusing(method):
            trace = text(trace_id, "trace_id")
        stream, _ = self.keys.planner_events(trace)
        entries = _entries(await self._client.xrange(stream))
        return [_decode(PLANNER_EVENT, parse_json(fields["d"]), self.types) for _, fields in entries]


def _call_keys(count: int) -> list[str]:
    """The call key of each of ``count`` planner events ('' for none): the guard's per-item keys,
    else ``<idempotency key>:<i>``, else none."""
    items = current_item_keys()
    if items is not None and len(items) == count:
        return [text(item, "idempotency_key") for item in items]
    key = current_idempotency_key()
    if key is None:
        return [""] * count
    key = text(key, "idempotency_key")
    return [f"{key}:{index}" for index in range(count)]


def _entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """Stream entries as ``(id, {field: value})`` text."""
    return [
        (decoded(entry_id), {decoded(name): decoded(value) for name, value in fields.items()})
        for entry_id, fields in reply
    ]


def _decode(codec: RecordCodec[Any], data: dict[str, Any], types: RecordTypes) -> Any:
    return codec.decode(data, types)


def _target_identity(client: Any, prefix: str) -> str:
    """``redis://HOST:PORT/DB?prefix=P`` (a cluster: ``redis-cluster://HOST:PORT?prefix=P`` of its
    first startup node), never with credentials."""
    if isinstance(client, RedisCluster):
        nodes = sorted(f"{node.host}:{node.port}" for node in client.get_nodes()) or ["?"]
        return f"redis-cluster://{nodes[0]}?prefix={prefix}"
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", {}) or {}
    if "path" in kwargs:
        return f"redis+unix://{kwargs['path']}?db={kwargs.get('db', 0)}&prefix={prefix}"
    host, port, db = kwargs.get("host", "localhost"), kwargs.get("port", 6379), kwargs.get("db", 0)
    return f"redis://{host}:{port}/{db}?prefix={prefix}"


def _decodes_responses(client: Any) -> bool:
    if isinstance(client, RedisCluster):
        kwargs = client.get_connection_kwargs()
    else:
        kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {}) or {}
    return bool(kwargs.get("decode_responses", False))


def _pool_size(client: Any) -> int | None:
    size = getattr(getattr(client, "connection_pool", None), "max_connections", None)
    return size if isinstance(size, int) and 0 < size < 100_000 else None


__all__ = ["DEFAULT_PREFIX", "RedisStateStore"]
