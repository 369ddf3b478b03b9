"""Sample every Redis node a store uses on an interval: a ``PING`` timed, then ``INFO``.

A single-node client (``redis.asyncio.Redis``) has one node, its ``host:port``; a cluster client
(``redis.asyncio.cluster.RedisCluster``) has the nodes of its current topology, primaries and
replicas, asked one by one (``target_nodes``). A node that does not answer within the timeout
is recorded down with the kind of its error; a node that leaves the topology stops being
exported. The sampler holds no connection of its own: it goes through the store's client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from redis import exceptions as redis_errors
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from .redis_metrics import NodeInfo, RedisStoreMetrics

logger = logging.getLogger("guarded.backends.redis")

DEFAULT_SAMPLE_INTERVAL_SECONDS = 15.0
"""How often the nodes are sampled by default (a Prometheus scrape interval)."""
DEFAULT_SAMPLE_TIMEOUT_SECONDS = 2.0
"""How long one node may take to answer one sample before it counts as down."""
_FAILURE_LOG_INTERVAL = 60.0

RedisClient = Redis | RedisCluster


def node_name(host: str, port: int | str) -> str:
    """The ``node`` label of a server: ``host:port``."""
    return f"{host}:{port}"


def single_node_name(client: Redis) -> str:
    """The ``node`` label of a single-node client's server (``unix:<path>`` for a socket)."""
    kwargs = client.connection_pool.connection_kwargs
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}"
    return node_name(kwargs.get("host", "localhost"), kwargs.get("port", 6379))


def error_kind(exc: BaseException) -> str:
    """The ``kind`` label of a failed Redis command (one of ``REDIS_NODE_ERROR_KINDS``)."""
    if isinstance(exc, (redis_errors.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(exc, redis_errors.BusyLoadingError):
        return "loading"
    if isinstance(exc, redis_errors.ReadOnlyError):
        return "readonly"
    if isinstance(exc, (redis_errors.ConnectionError, ConnectionError, OSError)):
        return "connection"
    if isinstance(exc, redis_errors.ResponseError):
        text = str(exc)
        if text.startswith("OOM"):
            return "oom"
        if text.startswith("BUSY"):
            return "busy"
        if text.startswith("READONLY"):
            return "readonly"
        if text.startswith("LOADING"):
            return "loading"
    return "other"


def _info(reply: Any, node: str) -> NodeInfo:
    if isinstance(reply, Mapping) and node in reply and isinstance(reply[node], Mapping):
        reply = reply[node]  # a cluster client's reply keyed by node name
    return NodeInfo(
        used_memory=int(reply.get("used_memory", 0)),
        maxmemory=int(reply.get("maxmemory", 0)),
        evicted_keys=int(reply.get("evicted_keys", 0)),
        expired_keys=int(reply.get("expired_keys", 0)),
        connected_clients=int(reply.get("connected_clients", 0)),
    )


class RedisNodeSampler:
    """Samples the nodes of ``client`` into ``metrics`` every ``interval`` seconds once started."""

    def __init__(
        self,
        client: RedisClient,
        metrics: RedisStoreMetrics,
        *,
        interval: float = DEFAULT_SAMPLE_INTERVAL_SECONDS,
        timeout: float = DEFAULT_SAMPLE_TIMEOUT_SECONDS,
    ) -> None:
        if interval <= 0 or timeout <= 0:
            raise ValueError(f"sample interval and timeout must be positive, got {interval} and {timeout}")
        self._client = client
        self._metrics = metrics
        self._interval = interval
        self._timeout = timeout
        self._task: asyncio.Task[None] | None = None
        self._last_failure_log = 0.0

    def nodes(self) -> dict[str, ClusterNode | None]:
        """The nodes to sample now, by name (``None``: the single node of a plain client)."""
        if isinstance(self._client, RedisCluster):
            return {node.name: node for node in self._client.get_nodes()}
        return {single_node_name(self._client): None}

    async def _command(self, node: ClusterNode | None, *args: str) -> Any:
        if node is None:
            return await self._client.execute_command(*args)
        return await self._client.execute_command(*args, target_nodes=node)

    async def _sample_node(self, name: str, node: ClusterNode | None) -> bool:
        try:
            async with asyncio.timeout(self._timeout):
                started = time.perf_counter()
                await self._command(node, "PING")
                ping = time.perf_counter() - started
                reply = await self._command(node, "INFO")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._metrics.node_failed(name, error_kind(exc))
            self._log_failure(name, exc)
            return False
        self._metrics.node_answered(name, ping, _info(reply, name))
        return True

    async def sample(self) -> dict[str, bool]:
        """Sample every node once; returns whether each answered."""
        nodes = self.nodes()
        for gone in self._metrics.nodes - nodes.keys():
            self._metrics.remove_node(gone)
        for name in nodes:
            self._metrics.add_node(name)
        answers = await asyncio.gather(*(self._sample_node(name, node) for name, node in nodes.items()))
        answered = dict(zip(nodes, answers, strict=True))
        if answered and all(answered.values()):
            self._metrics.sampled()
        return answered

    def start(self) -> None:
        """Sample in the background from now on (once; needs a running event loop)."""
        if self._task is not None:
            return
        for name in self.nodes():
            self._metrics.add_node(name)
        self._task = asyncio.get_running_loop().create_task(
            self._sample_forever(), name=f"guarded-redis-sampler-{self._metrics.store}"
        )

    async def _sample_forever(self) -> None:
        while True:
            try:
                await self.sample()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # topology refresh failed: the next round tries again
                self._log_failure("*", exc)
            await asyncio.sleep(self._interval)

    def _log_failure(self, node: str, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._last_failure_log > _FAILURE_LOG_INTERVAL:
            self._last_failure_log = now
            logger.warning(
                "guarded_redis_sample_failed",
                extra={"event": "guarded_redis_sample_failed", "node": node, "exception": repr(exc)},
            )

    async def close(self) -> None:
        """Stop sampling (the metrics stay until their owner closes them)."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None


class StoreSampling:
    """A store's metrics and its node sampler together: what :class:`RedisStateStore` holds.

    ``metrics=False`` exports nothing (every method is then a no-op); ``interval=None`` exports
    the pause counters without sampling the nodes. The sampler starts with :meth:`start`, at
    once when built inside a running event loop.
    """

    def __init__(
        self,
        client: RedisClient,
        *,
        store: str,
        registry: CollectorRegistry | None = None,
        metrics: bool = True,
        interval: float | None = DEFAULT_SAMPLE_INTERVAL_SECONDS,
    ) -> None:
        self.metrics = RedisStoreMetrics(store=store, registry=registry) if metrics else None
        self.sampler = (
            RedisNodeSampler(client, self.metrics, interval=interval)
            if self.metrics is not None and interval is not None
            else None
        )
        self._single_node = None if isinstance(client, RedisCluster) else single_node_name(client)
        with contextlib.suppress(RuntimeError):  # no running loop: start() later
            asyncio.get_running_loop()
            self.start()

    def start(self) -> None:
        """Sample the nodes in the background from now on (needs a running event loop)."""
        if self.sampler is not None:
            self.sampler.start()

    def pauses_saved(self, count: int) -> None:
        if self.metrics is not None and count:
            self.metrics.pause_saved(count)

    def pause_consumed(self) -> None:
        if self.metrics is not None:
            self.metrics.pause_consumed()

    def command_failed(self, exc: BaseException) -> None:
        """A store command raised ``exc``: counted against its node when the store can tell which
        (a single server; a cluster client does not say which node failed a command)."""
        if self.metrics is not None and self._single_node is not None:
            self.metrics.node_error(self._single_node, error_kind(exc))

    async def close(self) -> None:
        """Stop sampling and stop exporting this store's series."""
        if self.sampler is not None:
            await self.sampler.close()
        if self.metrics is not None:
            self.metrics.close()


__all__ = [
    "DEFAULT_SAMPLE_INTERVAL_SECONDS",
    "DEFAULT_SAMPLE_TIMEOUT_SECONDS",
    "RedisClient",
    "RedisNodeSampler",
    "StoreSampling",
    "error_kind",
    "node_name",
    "single_node_name",
]
