"""A throwaway real Redis Cluster for tests: three masters with one replica each, as processes.

:class:`RedisCluster` starts Debian's ``redis-server`` (``make tools`` installs it) once per node on
free loopback ports, each in its own directory of one temporary directory, with ``cluster-enabled
yes``, a low ``cluster-node-timeout`` (a failover takes a second or two, not fifteen) and
``appendonly yes`` / ``appendfsync always`` (a node killed with ``SIGKILL`` and restarted loses
nothing it acknowledged). ``redis-cli --cluster create ... --cluster-replicas 1`` joins them, and
:meth:`RedisCluster.start` returns once every node says ``cluster_state:ok``, every node sees the
same owner for every slot and every replica's link to its master is up::

    with redis_cluster() as cluster:
        client = cluster.async_client()          # redis.asyncio.cluster.RedisCluster
        new_master = cluster.fail_over(cluster.master_for_slot(0))   # SIGKILL, replica promoted
        cluster.restart(old_master)                                   # rejoins as a replica

The topology changes under a test (a failover swaps roles): :meth:`RedisCluster.masters`,
:meth:`RedisCluster.master_for_slot` and :meth:`RedisCluster.replicas_of` ask the cluster each time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncClusterClient

from .postgres import free_port

SLOTS = 16384
"""Hash slots of a Redis Cluster."""

_T = TypeVar("_T")


class RedisClusterError(RuntimeError):
    """A node of the cluster could not be started, the cluster did not form, or it did not settle."""


def redis_binary(name: str) -> str:
    """The path of ``redis-server`` or ``redis-cli``, or a :class:`RedisClusterError` saying how to
    get it."""
    found = shutil.which(name) or next(
        (path for path in (f"/usr/bin/{name}", f"/usr/local/bin/{name}") if os.access(path, os.X_OK)), None
    )
    if found is None:
        raise RedisClusterError(
            f"{name} is not installed: run `make tools` (as root it installs the Debian package "
            "'redis-server'), or `apt-get install redis-server`, or put the Redis binaries on PATH"
        )
    return found


@dataclass(eq=False)
class ClusterNode:
    """One ``redis-server`` process of the cluster: its ports, directory and (when running) process."""

    host: str
    port: int
    bus_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """The process was started and has not exited."""
        return self.process is not None and self.process.poll() is None

    @property
    def log_file(self) -> Path:
        return self.directory / "redis.log"

    def client(self, timeout: float = 2.0) -> redis.Redis:
        """A plain (not cluster-aware) synchronous client of this node alone."""
        return redis.Redis(
            host=self.host,
            port=self.port,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            decode_responses=True,
        )

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the node's log (for error messages)."""
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return ""
        return f"log of {self.address}:\n" + "\n".join(text.splitlines()[-lines:])


class RedisCluster:
    """A Redis Cluster of ``masters`` masters with ``replicas`` replicas each on ``127.0.0.1``."""

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = 1000,
        settle_timeout: float = 60.0,
    ) -> None:
        if masters < 3:
            raise ValueError("a Redis Cluster needs at least three masters")
        self.host = "127.0.0.1"
        self.master_count = masters
        self.replicas_per_master = replicas
        self.node_timeout_ms = node_timeout_ms
        self.settle_timeout = settle_timeout
        self.base_dir = Path(tempfile.mkdtemp(prefix="guarded-redis-cluster-"))
        self._server = redis_binary("redis-server")
        self._cli = redis_binary("redis-cli")
        self.nodes: list[ClusterNode] = []

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> RedisCluster:
        """Start every node, join them into a cluster and wait until it is settled."""
        if self.nodes:
            return self
        try:
            for index in range(self.master_count * (1 + self.replicas_per_master)):
                self.nodes.append(self._start_new_node(index))
            self._create()
            self._wait_settled()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_new_node(self, index: int) -> ClusterNode:
        last_error: RedisClusterError | None = None
        for _attempt in range(3):  # a port picked free may be taken before the server binds it
            directory = self.base_dir / f"node{index}"
            directory.mkdir(exist_ok=True)
            node = ClusterNode(self.host, free_port(self.host), free_port(self.host), directory)
            try:
                self._launch(node)
                return node
            except RedisClusterError as exc:
                last_error = exc
        assert last_error is not None
        raise last_error

    def _launch(self, node: ClusterNode) -> None:
        arguments = [
            "--bind", node.host,
            "--port", str(node.port),
            "--cluster-port", str(node.bus_port),
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--save", "",
            "--repl-diskless-sync-delay", "0",
            "--dir", str(node.directory),
            "--logfile", str(node.log_file),
            "--daemonize", "no",
        ]  # fmt: skip
        node.process = subprocess.Popen(
            [self._server, *arguments],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=str(node.directory),
        )
        deadline = time.monotonic() + self.settle_timeout
        while True:
            if not node.running:
                raise RedisClusterError(f"redis-server on {node.address} exited\n{node.log_tail()}")
            with contextlib.suppress(redis.RedisError), node.client() as client:
                if client.ping():
                    return
            if time.monotonic() > deadline:
                self._kill(node)
                raise RedisClusterError(f"redis-server on {node.address} did not answer\n{node.log_tail()}")
            time.sleep(0.05)

    def _create(self) -> None:
        command = [
            self._cli,
            "--cluster",
            "create",
            *(node.address for node in self.nodes),
            "--cluster-replicas",
            str(self.replicas_per_master),
            "--cluster-yes",
        ]
        try:
            subprocess.run(command, check=True, capture_output=True, text=True, timeout=self.settle_timeout)
        except subprocess.CalledProcessError as exc:
            output = f"{exc.stdout}\n{exc.stderr}"
            raise RedisClusterError(f"redis-cli --cluster create failed:\n{output}") from exc
        except subprocess.TimeoutExpired as exc:
            raise RedisClusterError("redis-cli --cluster create did not finish") from exc

    def stop(self) -> None:
        """Kill every node and delete the cluster's directory."""
        for node in self.nodes:
            self._kill(node)
        self.nodes = []
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- what the cluster looks like now --------------------------------------------------------

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every node (for a cluster client's ``startup_nodes``)."""
        return [(node.host, node.port) for node in self.nodes]

    @property
    def url(self) -> str:
        """``redis://host:port`` of a running node: a cluster client discovers the others from it."""
        node = next((node for node in self.nodes if node.running), None)
        if node is None:
            raise RedisClusterError("no node of the cluster is running")
        return f"redis://{node.host}:{node.port}"

    def async_client(self, **options: Any) -> AsyncClusterClient:
        """A cluster-aware :mod:`redis.asyncio` client knowing every node as a start-up node, so it
        connects while any node is down. ``options`` are the client's."""
        startup = [AsyncClusterNode(node.host, node.port) for node in self.nodes]
        return AsyncClusterClient(startup_nodes=startup, **options)

    def masters(self) -> list[ClusterNode]:
        """The nodes serving slots now, ordered by their first slot."""
        owners = self._slot_owners(self._any_running())
        seen: list[ClusterNode] = []
        for _start, _end, owner in owners:
            if owner not in seen:
                seen.append(owner)
        return seen

    def master_for_slot(self, slot: int) -> ClusterNode:
        """The node serving ``slot`` now."""
        if not 0 <= slot < SLOTS:
            raise ValueError(f"a slot is in 0..{SLOTS - 1}, not {slot}")
        for start, end, owner in self._slot_owners(self._any_running()):
            if start <= slot <= end:
                return owner
        raise RedisClusterError(f"no node serves slot {slot}")

    def replicas_of(self, master: ClusterNode) -> list[ClusterNode]:
        """The running nodes replicating ``master`` now."""
        replicas = []
        for node in self._running():
            with node.client() as client:
                info = client.info("replication")
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == master.port:
                replicas.append(node)
        return replicas

    def key_slot(self, key: str) -> int:
        """The hash slot of ``key`` (``CLUSTER KEYSLOT``)."""
        with self._any_running().client() as client:
            return int(client.execute_command("CLUSTER", "KEYSLOT", key))

    # -- faults -----------------------------------------------------------------------------------

    def kill(self, node: ClusterNode) -> None:
        """``SIGKILL`` one node (no waiting for the cluster to notice)."""
        if not node.running:
            raise RedisClusterError(f"{node.address} is not running")
        self._kill(node)

    def fail_over(self, master: ClusterNode) -> ClusterNode:
        """Kill ``master`` with ``SIGKILL`` and wait until one of its replicas has been promoted and
        the cluster is settled again; return the promoted node. Bring the killed node back with
        :meth:`restart` (it rejoins as a replica)."""
        replicas = self.replicas_of(master)
        if not replicas:
            raise RedisClusterError(f"{master.address} has no replica to fail over to")
        self.kill(master)
        promoted = self._wait(
            lambda: next((node for node in replicas if node.running and self._role(node) == "master"), None),
            f"no replica of {master.address} was promoted",
        )
        self._wait_settled()
        return promoted

    def restart(self, node: ClusterNode) -> None:
        """Start a killed node again on its ports and directory (its ``nodes.conf`` keeps its
        identity) and wait until the cluster is settled with it: a master that was failed over
        rejoins as a replica of the node that took its slots."""
        if node.running:
            raise RedisClusterError(f"{node.address} is still running")
        self._launch(node)
        self._wait_settled()

    # -- plumbing ---------------------------------------------------------------------------------

    def _running(self) -> list[ClusterNode]:
        return [node for node in self.nodes if node.running]

    def _any_running(self) -> ClusterNode:
        running = self._running()
        if not running:
            raise RedisClusterError("no node of the cluster is running")
        return running[0]

    def _kill(self, node: ClusterNode) -> None:
        process, node.process = node.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait(timeout=30)

    def _by_address(self, host: str, port: int) -> ClusterNode:
        for node in self.nodes:
            if node.port == port:
                return node
        raise RedisClusterError(f"{host}:{port} is not a node of this cluster")

    def _slot_owners(self, asked: ClusterNode) -> list[tuple[int, int, ClusterNode]]:
        """``(first slot, last slot, master)`` as ``asked`` sees the cluster, by first slot."""
        with asked.client() as client:
            ranges = client.execute_command("CLUSTER", "SLOTS")
        owners = []
        for start, end, primary, *_replicas in ranges:
            host, port = primary[:2]
            owners.append((int(start), int(end), self._by_address(str(host), int(port))))
        return sorted(owners, key=lambda owner: owner[0])

    def _role(self, node: ClusterNode) -> str:
        with node.client() as client:
            return str(client.info("replication").get("role"))

    def _settled_problem(self) -> str | None:
        """Why the cluster is not settled yet, or ``None`` when it is: every running node says
        ``cluster_state:ok``, all see the same running master for every slot, and every running
        replica's link to its master is up (so ``WAIT 1`` can be answered)."""
        running = self._running()
        views = []
        for node in running:
            with node.client() as client:
                state = client.execute_command("CLUSTER", "INFO")
                state = state if isinstance(state, dict) else _parse_info(str(state))
                if state.get("cluster_state") != "ok":
                    return f"{node.address} says cluster_state:{state.get('cluster_state')}"
                replication = client.info("replication")
                if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                    return f"the replica {node.address} has no link to its master"
            owners = self._slot_owners(node)
            if sum(end - start + 1 for start, end, _ in owners) != SLOTS:
                return f"{node.address} does not see every slot served"
            if any(not owner.running for _, _, owner in owners):
                return f"{node.address} still sees a stopped node serving slots"
            views.append([(start, end, owner.port) for start, end, owner in owners])
        if any(view != views[0] for view in views):
            return "the nodes do not agree on which master serves which slots"
        return None

    def _wait_settled(self) -> None:
        problem: list[str | None] = [None]

        def settled() -> bool | None:
            try:
                problem[0] = self._settled_problem()
            except redis.RedisError as exc:
                problem[0] = f"a node did not answer: {exc}"
            return True if problem[0] is None else None

        self._wait(settled, lambda: f"the cluster did not settle: {problem[0]}")

    def _wait(self, condition: Callable[[], _T | None], failure: str | Callable[[], str]) -> _T:
        deadline = time.monotonic() + self.settle_timeout
        while True:
            try:
                found = condition()
            except redis.RedisError:
                found = None
            if found is not None:
                return found
            if time.monotonic() > deadline:
                message = failure() if callable(failure) else failure
                logs = "\n".join(node.log_tail(8) for node in self.nodes)
                raise RedisClusterError(f"{message} within {self.settle_timeout:.0f} s\n{logs}")
            time.sleep(0.05)


def _parse_info(text: str) -> dict[str, str]:
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {name.strip(): value.strip() for name, value in pairs}


@contextlib.contextmanager
def redis_cluster(**options: Any) -> Iterator[RedisCluster]:
    """Start a disposable cluster, yield it, then kill its nodes and delete their files."""
    cluster = RedisCluster(**options)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


__all__ = [
    "SLOTS",
    "ClusterNode",
    "RedisCluster",
    "RedisClusterError",
    "redis_binary",
    "redis_cluster",
]
