"""``python -m benchmarks.protocol_gap [--dsn DSN] [--method NAME ...]``: where the time of
``guard(PostgresStateStore)`` beyond raw asyncpg goes, per call.

Two measurements:

* **On the server** (the embedded one, or ``--dsn``): for each method, raw asyncpg replaying the
  store's recorded statements on a pool without the reset (as in the protocol section), the bare
  store and ``guard(store)``. Rounds of every series in a shuffled order (a fixed order favours
  the series that follows another on the same connections); per call, the median wall time, the
  client's CPU time (``time.process_time``) and the context switches of the client process. An
  involuntary switch at about every call means the server (or another process) takes the
  client's core at each round trip: the client resumes with cold caches.
* **Without a server**: the guard's added cost over the in-memory null backend of the guard
  section, with warm caches (a tight loop, as the guard section measures it) and with the caches
  evicted before each call (8 MiB touched, untimed), which is how the client finds them after a
  round trip to a server on the same cores.

When the guard's added cost on the server matches its evicted-cache figure, not its warm one,
what separates the guarded store from raw asyncpg is the Python the call runs, paid at
cache-miss prices: the number of functions and objects a call touches, not any one of them.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from prometheus_client import CollectorRegistry

from guarded import controller, guard

from .guard_report import render_table
from .postgres_protocol import AsyncCall, _bound, _no_reset, _replay, recorded_store
from .workload import PROTOCOL_METHODS, NullStore, calls, seeds

SCHEMA = "bench_gap"
METHODS = ("save_event", "load_memory_state")
EVICTED_BYTES = 8 << 20
"""Touched before each call of the evicted-cache series: more than this machine's L2 per core."""


@dataclass
class Series:
    """One way of making a call, and what each round measured of it."""

    call: AsyncCall
    wall_us: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    switches: list[tuple[int, int]] = field(default_factory=list)
    """Voluntary and involuntary context switches of the client, per round."""

    def switches_per_call(self, per_round: int) -> tuple[float, float]:
        calls_made = per_round * len(self.switches) or 1
        return (
            sum(voluntary for voluntary, _ in self.switches) / calls_made,
            sum(involuntary for _, involuntary in self.switches) / calls_made,
        )


async def time_shuffled(
    entries: Sequence[dict[str, Series]], *, rounds: int, per_round: int, before: Any = None
) -> None:
    """Rounds of every series of every entry, in a shuffled order within each entry; ``before``
    (untimed) runs ahead of each call. One warm-up round untimed."""
    for round_number in range(rounds + 1):
        for entry in entries:
            order = list(entry.values())
            random.shuffle(order)
            for series in order:
                wall = cpu = 0.0
                usage = resource.getrusage(resource.RUSAGE_SELF)
                for _ in range(per_round):
                    if before is not None:
                        before()
                    started, started_cpu = time.perf_counter(), time.process_time()
                    await series.call()
                    wall += time.perf_counter() - started
                    cpu += time.process_time() - started_cpu
                after = resource.getrusage(resource.RUSAGE_SELF)
                if round_number:
                    series.wall_us.append(wall / per_round * 1e6)
                    series.cpu_us.append(cpu / per_round * 1e6)
                    series.switches.append(
                        (after.ru_nvcsw - usage.ru_nvcsw, after.ru_nivcsw - usage.ru_nivcsw)
                    )


async def on_server(
    dsn: str, methods: Sequence[str], *, rounds: int, per_round: int
) -> dict[str, dict[str, Series]]:
    """Raw (no reset), bare store and guard for each of ``methods`` on ``dsn`` (schema reset)."""
    store, recorder = await recorded_store(dsn, SCHEMA)
    raw = await asyncpg.create_pool(dsn, min_size=2, max_size=2, reset=_no_reset)
    assert raw is not None
    proxy = guard(store, name="bench-gap", registry=CollectorRegistry())
    table = calls()
    measured: dict[str, dict[str, Series]] = {}
    try:
        for seed in seeds():
            await getattr(store, seed.method)(*seed.args, **seed.kwargs)
        for method in methods:
            arguments = table[method]
            statements = await recorder.record(_bound(store, method, arguments))
            measured[method] = {
                "raw, no reset": Series(_replay(raw, statements)),
                "bare store": Series(_bound(store, method, arguments)),
                "guard": Series(_bound(proxy, method, arguments)),
            }
        recorder.uninstall()
        await time_shuffled(list(measured.values()), rounds=rounds, per_round=per_round)
    finally:
        await controller(proxy).aclose()
        await raw.close()
        await store.close()
    return measured


async def null_backend(
    methods: Sequence[str], *, rounds: int, per_round: int
) -> dict[str, dict[str, dict[str, Series]]]:
    """``guard(NullStore())`` and the bare null store, caches warm and evicted before each call."""
    store = NullStore()
    proxy = guard(store, name="bench-gap-null", registry=CollectorRegistry())
    table = calls()
    evicted = bytearray(EVICTED_BYTES)
    stride = b"\x01" * (EVICTED_BYTES // 64)

    def evict() -> None:
        evicted[::64] = stride

    measured: dict[str, dict[str, dict[str, Series]]] = {}
    try:
        for method in methods:
            arguments = table[method]
            measured[method] = {}
            for caches, before in (("warm", None), ("evicted", evict)):
                entry = {
                    "bare": Series(_bound(store, method, arguments)),
                    "guard": Series(_bound(proxy, method, arguments)),
                }
                await time_shuffled([entry], rounds=rounds, per_round=per_round, before=before)
                measured[method][caches] = entry
    finally:
        await controller(proxy).aclose()
    return measured


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def format_report(
    server: dict[str, dict[str, Series]], null: dict[str, dict[str, dict[str, Series]]], per_round: int
) -> str:
    """Both measurements as tables (the server's empty when it was not measured)."""
    header = (
        "method",
        "series",
        "wall µs",
        "x raw",
        "client CPU µs",
        "x raw",
        "vol. sw/call",
        "invol. sw/call",
    )
    body = []
    for method, entry in server.items():
        raw = entry["raw, no reset"]
        raw_wall, raw_cpu = _median(raw.wall_us), _median(raw.cpu_us)
        for name, series in entry.items():
            wall, cpu = _median(series.wall_us), _median(series.cpu_us)
            voluntary, involuntary = series.switches_per_call(per_round)
            body.append(
                (
                    method,
                    name,
                    f"{wall:.0f}",
                    f"{wall / raw_wall:.2f}",
                    f"{cpu:.0f}",
                    f"{cpu / raw_cpu:.2f}",
                    f"{voluntary:.2f}",
                    f"{involuntary:.2f}",
                )
            )
    lines = ["== where guard(PostgresStateStore)'s time beyond raw asyncpg goes, per call ==", ""]
    if body:
        lines += [*render_table(header, body), ""]
    null_body = []
    for method, by_caches in null.items():
        added = [
            f"{_median(entry['guard'].wall_us) - _median(entry['bare'].wall_us):+.1f}"
            for entry in by_caches.values()
        ]
        on_server = "-"
        if method in server:
            guarded, bare = server[method]["guard"], server[method]["bare store"]
            on_server = f"{_median(guarded.wall_us) - _median(bare.wall_us):+.1f}"
        null_body.append((method, *added, on_server))
    lines.append("guard's added µs per call (median of rounds): over the null backend, and on the server")
    lines += [
        "",
        *render_table(("method", "caches warm", "caches evicted", "on the server"), null_body, left=1),
    ]
    lines.append(f"\nmedian over the rounds of {per_round} calls per series, series shuffled in each round")
    return "\n".join(lines)


async def run(
    dsn: str | None, methods: Sequence[str], *, rounds: int, per_round: int
) -> tuple[dict[str, dict[str, Series]], dict[str, dict[str, dict[str, Series]]], str]:
    """Both measurements (the server's only with ``dsn``) and the report."""
    server = await on_server(dsn, methods, rounds=rounds, per_round=per_round) if dsn else {}
    null = await null_backend(methods, rounds=rounds, per_round=per_round)
    return server, null, format_report(server, null, per_round)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.protocol_gap", description=__doc__)
    parser.add_argument("--dsn", help="PostgreSQL to use (default: start an embedded server)")
    parser.add_argument("--method", action="append", choices=PROTOCOL_METHODS)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--per-round", type=int, default=20)
    args = parser.parse_args(argv)
    methods = args.method or list(METHODS)
    if args.dsn:
        _, _, text = asyncio.run(run(args.dsn, methods, rounds=args.rounds, per_round=args.per_round))
    else:
        from guarded.testing.postgres import embedded_postgres

        with embedded_postgres() as server:
            _, _, text = asyncio.run(run(server.dsn, methods, rounds=args.rounds, per_round=args.per_round))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
