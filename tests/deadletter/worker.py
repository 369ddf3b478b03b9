"""A process with a dead-letter buffer, for the tests where processes matter.

``python -m tests.deadletter.worker hold --path P --target T --trace t --events N``: hold N events
of trace ``t`` and a memory state per event, print one JSON line (``spill_path``, ``depth``), then
wait for a line on stdin: ``close`` closes the buffer cleanly, ``adopt`` runs
:meth:`~guarded.deadletter.DeadLetterBuffer.adopt_orphans` and prints its answer.

``python -m tests.deadletter.worker replay --path P --target T``: open the buffer (claiming and
adopting what processes that are gone left), replay it into an in-memory store and print one
JSON line: how many waited, were replayed, and the event ids and memory states the store got.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys

from prometheus_client import CollectorRegistry

from guarded.backends.memory import InMemoryStateStore
from guarded.config import DeadLetterConfig
from guarded.deadletter import DeadLetterBuffer, store_sender
from tests.deadletter.support import event


def _buffer(args: argparse.Namespace) -> DeadLetterBuffer:
    return DeadLetterBuffer(
        DeadLetterConfig(path=args.path),
        store_name="worker",
        registry=CollectorRegistry(),
        target=args.target,
    )


def _say(**document: object) -> None:
    print(json.dumps(document), flush=True)


async def hold(args: argparse.Namespace) -> None:
    buffer = _buffer(args)
    for index in range(args.events):
        await buffer.put(
            "save_event", (event(args.trace, index),), {}, scope=args.trace, stamp=index, error="x"
        )
        key = f"{args.trace}:m{index}"
        await buffer.put(
            "save_memory_state", (key, {"v": index}), {}, key=key, stamp=args.events + index, error="x"
        )
    _say(spill_path=buffer.spill_path, depth=buffer.depth, available=buffer.spill_available)
    loop = asyncio.get_running_loop()
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if line == "adopt":
            adopted = await buffer.adopt_orphans()
            _say(adopted=adopted, depth=buffer.depth)
        elif line in ("close", ""):
            await buffer.aclose()
            _say(closed=True)
            return


async def replay(args: argparse.Namespace) -> None:
    buffer = _buffer(args)
    store = InMemoryStateStore()
    try:
        waiting = await buffer.open()
        send, send_bulk = store_sender(store)
        summary = await buffer.replay(send, send_bulk=send_bulk, rate=math.inf)
        events = []
        for trace in args.traces:
            events.extend(f"{trace}:{item.payload['i']}" for item in await store.load_history(trace))
        _say(
            waiting=waiting,
            replayed=summary.replayed,
            remaining=summary.remaining,
            spill_path=buffer.spill_path,
            events=events,
        )
    finally:
        await buffer.aclose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("hold", "replay"))
    parser.add_argument("--path", required=True)
    parser.add_argument("--target", default=None)
    parser.add_argument("--trace", default="t")
    parser.add_argument("--traces", nargs="*", default=[])
    parser.add_argument("--events", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(hold(args) if args.mode == "hold" else replay(args))


if __name__ == "__main__":
    main()
