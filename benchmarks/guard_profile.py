"""``python -m benchmarks.guard_profile [--method NAME] [--calls N] [--tracing none|off]``: where a
guarded call's time goes.

Runs one protocol method of ``guard(NullStore())`` (the guard section's in-memory null backend, see
:mod:`benchmarks.workload`) in a loop under ``cProfile`` and prints the own time per source file
(which layer, the batcher, the proxy, asyncio, prometheus-client, OpenTelemetry) and the
functions with the most own time. It reads no private attribute of the guard, so it keeps working
while the core is restructured. Profiling inflates every Python call alike, so read shares, not
microseconds; the guard section of ``python -m benchmarks`` gives the unprofiled figures.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
from collections.abc import Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from guarded import controller, guard

from .guard_bench import YIELD_EVERY, tracer_provider
from .workload import PROTOCOL_METHODS, NullStore, calls

ROOT = Path(__file__).resolve().parent.parent


async def profile(method: str, count: int, tracing: str) -> pstats.Stats:
    """Profile ``count`` calls of ``method`` (after as many unprofiled warm-up calls)."""
    provider, _ = tracer_provider("off" if tracing == "off" else "none")
    proxy = guard(NullStore(), name="profile", registry=CollectorRegistry(), tracer_provider=provider)
    arguments = calls()[method]
    call = getattr(proxy, method)
    args, kwargs = arguments.args, arguments.kwargs

    async def loop() -> None:
        for index in range(count):
            await call(*args, **kwargs)
            if index % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)

    await loop()
    profiler = cProfile.Profile()
    profiler.enable()
    await loop()
    profiler.disable()
    await controller(proxy).aclose()
    return pstats.Stats(profiler)


def _where(filename: str) -> str:
    if filename == "~":
        return "(built-in functions)"
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        parts = path.parts
        if "site-packages" in parts:
            return "/".join(parts[parts.index("site-packages") + 1 :][:2])
        return filename if filename.startswith("<") else "/".join(parts[-2:])


def report(stats: pstats.Stats, count: int, top: int) -> str:
    """Own time per source file and the ``top`` functions by own time, per call."""
    entries = stats.stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in entries.values()) or 1e-12
    by_file: dict[str, float] = {}
    for (filename, _, _), entry in entries.items():
        by_file[_where(filename)] = by_file.get(_where(filename), 0.0) + entry[2]
    lines = [f"profiled own time: {total / count * 1e6:.2f} µs per call (inflated by the profiler)", ""]
    lines.append(f"{'share':>6}  {'µs/call':>8}  file")
    for where, seconds in sorted(by_file.items(), key=lambda item: -item[1])[:top]:
        lines.append(f"{seconds / total:6.1%}  {seconds / count * 1e6:8.2f}  {where}")
    lines += ["", f"{'share':>6}  {'µs/call':>8}  {'calls/call':>10}  function"]
    ranked = sorted(entries.items(), key=lambda item: -item[1][2])[:top]
    for (filename, line, function), entry in ranked:
        lines.append(
            f"{entry[2] / total:6.1%}  {entry[2] / count * 1e6:8.2f}  {entry[1] / count:10.2f}  "
            f"{function} ({_where(filename)}:{line})"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.guard_profile", description=__doc__)
    parser.add_argument("--method", default="save_event", choices=PROTOCOL_METHODS)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--tracing", default="none", choices=("none", "off"))
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    stats = asyncio.run(profile(args.method, args.calls, args.tracing))
    print(f"guard(NullStore()).{args.method}, {args.calls:,} calls, tracing {args.tracing}\n")
    print(report(stats, args.calls, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
