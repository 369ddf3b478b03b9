"""The workload of the durability acceptance tests, and the guarded process they start and kill.

The workload is tests/postgres/_outages.py's (:class:`Ledger`, :func:`write_call`,
:func:`read_back`) plus remote bindings, so every write method of the store is made: write
``index`` of writer ``w`` is of kind ``MIXED_KINDS[index % 9]``. :class:`MixedLedger` records what
was acknowledged, :func:`read_back_mixed` what PostgreSQL holds, in the same shape.

Run as a script (``python -m tests.durability._worker MODE ...``):

``readme DSN SCHEMA COUNT TASKS``
    The README's first snippet: ``store = guard(await PostgresStateStore.connect(dsn,
    schema=...))``, then ``COUNT`` ``await store.save_event(...)`` from ``TASKS`` concurrent tasks,
    and ``asyncio.run`` returns without closing the guard. Prints ``done``.

``ack --dsn DSN --schema SCHEMA [--first N] [--writers N] [--per-writer N] [--pause S] [--fast]
[--spill PATH] [--max-disk-bytes N] [--strict]
[--lazy] [--hold]``
    ``--writers`` concurrent writers (numbered from ``--first``) make the mixed writes in order,
    ``--per-writer`` each (0: until SIGTERM). Each acknowledged write is printed as one line
    ``A <writer> <index>`` (flushed at once, so a killed process has told what it acknowledged);
    a write that raised as ``E <writer> <index> <error>``. With ``--per-writer``, ``H`` once every
    write is acknowledged; with ``--hold`` the process then sleeps until it is killed. On SIGTERM
    the writers stop (``S``), the guard drains and closes, and ``C <left over>`` is printed.
    ``--fast``: short timeouts and a quickly reopening breaker (:func:`fast_config`), so writes
    are dead-lettered within a second of a stall; otherwise the default configuration.
    ``--spill PATH``: ``DeadLetterConfig(path=PATH)``; otherwise the default spill path
    (``$XDG_STATE_HOME/guarded/<name>...``). ``--max-disk-bytes``: the spill file's byte cap.
    ``--strict``: strict mode, so a write the guard refuses raises (an ``E`` line).
    ``--lazy``: ``PostgresStateStore.lazy`` (for a database that is down when the process starts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from guarded.backends.postgres import PostgresStateStore
from guarded.config import DeadLetterConfig, GuardConfig
from guarded.guard import controller, guard
from guarded.models import RemoteBinding, StoredEvent
from tests.postgres._outages import (
    KINDS,
    Ledger,
    WriteCall,
    drain_all,
    open_store,
    outage_config,
    pool_settings,
    read_back,
    write_call,
)

MIXED_KINDS = (*KINDS, "save_remote_binding")
"""Write ``index`` of a writer is of kind ``MIXED_KINDS[index % 9]``."""


@dataclass
class MixedLedger(Ledger):
    """A :class:`Ledger` with remote bindings: every write method of the store."""

    bindings: dict[tuple[str, str, str], str] = field(default_factory=dict)
    """(trace id, context id, task id) -> agent URL of the last acknowledged save."""

    def parts(self) -> dict[str, Any]:
        return {**super().parts(), "bindings": self.bindings}


def mixed_write_call(writer: int, index: int) -> WriteCall:
    """Write ``index`` of ``writer``: one of :func:`write_call`'s eight kinds, or a binding.

    Kind ``k < 8`` of round ``r`` is ``write_call(writer, 8 * r + k)``: a writer's writes of one
    kind keep their order, so the last acknowledged write of a key is still its last value.
    """
    rounds, kind = divmod(index, len(MIXED_KINDS))
    if kind < len(KINDS):
        return write_call(writer, rounds * len(KINDS) + kind)
    trace, context, task = f"bind-{writer}", f"ctx-{rounds % 2}", f"task-{writer}"
    url = f"http://agent-{writer}/{index}"
    binding = RemoteBinding(trace, context, task, url, router_session_id=f"router-{writer}")

    def record_binding(ledger: Ledger) -> None:
        assert isinstance(ledger, MixedLedger)
        ledger.bindings[(trace, context, task)] = url

    return "save_remote_binding", lambda store: store.save_remote_binding(binding), record_binding


async def perform_mixed(store: Any, ledger: MixedLedger, writer: int, index: int) -> None:
    """Make write ``index`` of ``writer``; record it when acknowledged, the exception otherwise."""
    _, make_call, record = mixed_write_call(writer, index)
    try:
        await make_call(store)
    except Exception as exc:  # a guarded store must never raise: collected, asserted to be none
        ledger.errors.append(exc)
    else:
        record(ledger)
    finally:
        ledger.calls += 1


async def run_mixed(
    store: Any, ledger: MixedLedger, *, writers: int, per_writer: int, start: int = 0, pause: float = 0.0
) -> None:
    """``writers`` concurrent writers, each making writes ``start .. start + per_writer - 1`` in order."""

    async def one(writer: int) -> None:
        for index in range(start, start + per_writer):
            await perform_mixed(store, ledger, writer, index)
            await asyncio.sleep(pause)

    await asyncio.gather(*(one(writer) for writer in range(writers)))


def ledger_of(acks: Iterable[tuple[int, int]]) -> MixedLedger:
    """The ledger of the writes ``(writer, index)``, acknowledged in this order."""
    ledger = MixedLedger()
    for writer, index in acks:
        mixed_write_call(writer, index)[2](ledger)
        ledger.calls += 1
    return ledger


async def read_back_mixed(dsn: str, schema: str) -> MixedLedger:
    """What the database holds (:func:`read_back`, plus the remote bindings)."""
    base = await read_back(dsn, schema)
    found = MixedLedger(**{part.name: getattr(base, part.name) for part in fields(Ledger)})
    conn = await asyncpg.connect(dsn)
    try:
        for row in await conn.fetch(f'SELECT trace_id, task_id, doc FROM "{schema}".remote_bindings'):
            doc = json.loads(row["doc"])
            found.bindings[(row["trace_id"], doc["context_id"], row["task_id"])] = doc["agent_url"]
    finally:
        await conn.close()
    return found


def landed_differences(acked: MixedLedger, at_most: MixedLedger, found: MixedLedger) -> dict[str, str]:
    """Per part, what differs between the database (``found``) and the acknowledged writes.

    ``acked`` holds the writes a process acknowledged; ``at_most`` the same plus the writes it had
    in flight when it was killed (acknowledged or not, they may or may not have landed). Every
    acknowledged append must be stored exactly once, and nothing else but an in-flight one; every
    upsert key must hold its last acknowledged value, or the value of its in-flight write.
    """
    problems: dict[str, str] = {}
    for name, want in acked.parts().items():
        most, got = at_most.parts()[name], found.parts()[name]
        if isinstance(want, Counter):
            missing = want - got
            extra = got - most
            twice = {key: count for key, count in got.items() if count > 1}
            if missing or extra or twice:
                problems[name] = (
                    f"{sum(missing.values())} acknowledged writes missing (e.g. {list(missing)[:3]}), "
                    f"{sum(extra.values())} never written (e.g. {list(extra)[:3]}), "
                    f"{len(twice)} stored more than once (e.g. {list(twice.items())[:3]})"
                )
        else:
            wrong = {
                key: (want.get(key), got.get(key))
                for key in set(want) | set(most) | set(got)
                if got.get(key) not in (want.get(key), most.get(key))
            }
            if wrong:
                problems[name] = (
                    f"{len(wrong)} keys hold neither their last acknowledged value nor an in-flight one "
                    f"(acknowledged, found), e.g. {list(wrong.items())[:3]}"
                )
    return problems


def describe(problems: dict[str, str]) -> str:
    """The problems of :func:`landed_differences` or ``differences``, one part a line."""
    return "what the database holds differs from what was acknowledged:\n" + "\n".join(
        f"  {name}: {problem}" for name, problem in sorted(problems.items())
    )


def fast_config(spill: str | None, *, max_disk_bytes: int | None = None, strict: bool = False) -> GuardConfig:
    """tests/postgres/_outages.py's short timeouts and quick breaker; spill file at ``spill``, or at
    the default path when ``None``, capped at ``max_disk_bytes`` when given."""
    options: dict[str, Any] = {"replay_rate": 1_000_000, "replay_batch": 500, "drain_timeout": 30}
    if spill is not None:
        options["path"] = spill
    if max_disk_bytes is not None:
        options["max_disk_bytes"] = max_disk_bytes
    config = outage_config(dead_letter=DeadLetterConfig(**options))
    return config.model_copy(update={"strict": True}) if strict else config


# --- the processes -------------------------------------------------------------------------------


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def readme(dsn: str, schema: str, count: int, tasks: int) -> None:
    store = guard(await PostgresStateStore.connect(dsn, schema=schema), registry=CollectorRegistry())

    async def task(number: int) -> None:
        for index in range(number, count, tasks):
            await store.save_event(StoredEvent("readme", float(index), "node_end", "node", f"n{index}", {}))

    await asyncio.gather(*(task(number) for number in range(tasks)))
    emit("done")  # and asyncio.run returns: the guard is never closed


async def acknowledge(options: argparse.Namespace) -> None:
    config = (
        fast_config(options.spill, max_disk_bytes=options.max_disk_bytes, strict=options.strict)
        if options.fast
        else None
    )
    if config is None and options.spill is not None:
        config = GuardConfig(dead_letter=DeadLetterConfig(path=options.spill), strict=options.strict)
    if options.lazy:
        backend = PostgresStateStore.lazy(
            options.dsn,
            schema=options.schema,
            registry=CollectorRegistry(),
            stats_interval=None,
            pool=pool_settings(),
        )
    else:
        backend = await open_store(options.dsn, options.schema)
    store = guard(backend, registry=CollectorRegistry(), config=config)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def writer(number: int) -> None:
        index = 0
        while not stop.is_set() and (options.per_writer == 0 or index < options.per_writer):
            _, make_call, _ = mixed_write_call(number, index)
            try:
                await make_call(store)
            except Exception as exc:
                emit(f"E {number} {index} {exc!r}")
            else:
                emit(f"A {number} {index}")
            index += 1
            await asyncio.sleep(options.pause)

    first = options.first
    await asyncio.gather(*(writer(number) for number in range(first, first + options.writers)))
    if not stop.is_set():
        emit("H")
        if options.hold:
            await asyncio.sleep(3600)  # until the test kills the process
        await stop.wait()
    emit("S")
    left = await drain_all(store, seconds=60)
    await controller(store).aclose()
    emit(f"C {left}")


async def memory_then_hold(dsn: str, schema: str, value: str, keys: list[str]) -> None:
    """Ready (``R``); on SIGUSR1, save ``value`` as the memory state of each of ``keys`` (``K key``
    once each returned), then hold (``H``) until killed."""
    store = guard(await open_store(dsn, schema), registry=CollectorRegistry())
    go = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, go.set)
    await store.save_memory_state("ready", {"v": value})  # the spill slot is claimed
    emit("R")
    await go.wait()
    for key in keys:
        await store.save_memory_state(key, {"v": value})
        emit(f"K {key}")
    emit("H")
    await asyncio.sleep(3600)  # until the test kills the process


def main(argv: list[str]) -> None:
    if argv[0] == "memory":
        dsn, schema, value, *keys = argv[1:]
        asyncio.run(memory_then_hold(dsn, schema, value, keys))
        return
    if argv[0] == "readme":
        dsn, schema, count, tasks = argv[1:5]
        asyncio.run(readme(dsn, schema, int(count), int(tasks)))
        return
    parser = argparse.ArgumentParser(prog="tests.durability._worker ack")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--per-writer", type=int, default=0)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--fast", action="store_true")
    parser.add_argument("--spill")
    parser.add_argument("--max-disk-bytes", type=int)
    parser.add_argument("--strict", action="store_true")
    parser.add_argument("--lazy", action="store_true")
    parser.add_argument("--hold", action="store_true")
    asyncio.run(acknowledge(parser.parse_args(argv[1:])))


if __name__ == "__main__":
    main(sys.argv[1:])
