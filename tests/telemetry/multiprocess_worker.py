"""Worker processes of the multiprocess metrics test (run with ``PROMETHEUS_MULTIPROC_DIR`` set).

``python -m tests.telemetry.multiprocess_worker INDEX SPILL_DIR [timer]``: guards an in-memory
store named ``agents`` on the default registry, runs a workload whose size depends on ``INDEX``
(worker 1 also loses its backend and opens its breaker, so it holds writes and retries), writes
its scrape-time metrics into the multiprocess directory (or, with ``timer``, leaves that to the
writer's thread), prints its own view of every ``guarded_`` sample as one JSON line, and waits
for a line on stdin before it exits.

``python -m tests.telemetry.multiprocess_worker fork``: 3 calls, then ``fork()``, then 4 more
calls in the child, as a server that imports the application before forking its workers does.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY

from guarded import controller, guard
from guarded.backends.memory import InMemoryStateStore
from guarded.config import (
    BreakerConfig,
    BulkheadConfig,
    DeadLetterConfig,
    GuardConfig,
    RetryConfig,
    TimeoutConfig,
)
from guarded.models import StoredEvent
from guarded.observability.multiprocess_metrics import write_scrape_time_metrics
from guarded.telemetry.prometheus import PrometheusTaskTelemetrySink
from guarded.testing import Fault, FaultPlan, FaultyStore, fault_injector
from tests.telemetry.support import pf_event


def own_view() -> list[dict[str, Any]]:
    """Every ``guarded_`` sample this process's registry gives (its own numbers only)."""
    return [
        {
            "family": family.name,
            "type": family.type,
            "name": sample.name,
            "labels": sample.labels,
            "value": sample.value,
        }
        for family in REGISTRY.collect()
        if family.name.startswith("guarded_")
        for sample in family.samples
    ]


async def workload(index: int, spill_dir: Path) -> Any:
    faulty = FaultyStore(InMemoryStateStore(), FaultPlan())
    config = GuardConfig(
        timeout=TimeoutConfig(attempt=1.0, deadline=5.0),
        retry=RetryConfig(max_attempts=3, initial_backoff=0.001, max_backoff=0.002),
        breaker=BreakerConfig.model_validate(
            {"window_size": 100, "minimum_calls": 100, "open_duration": 600.0}
        ),
        bulkhead=BulkheadConfig(max_concurrent=4),
        dead_letter=DeadLetterConfig(path=str(spill_dir / f"worker-{index}.sqlite"), drain_timeout=0.5),
    )
    store = guard(faulty, name="agents", config=config)
    for number in range(5 * index):
        await store.save_memory_state(f"key-{number}", {"n": number})
        await store.load_memory_state(f"key-{number}")
    await asyncio.gather(
        *(
            store.save_event(
                StoredEvent(f"trace-{index}", float(number), "node_start", "n", "n-1", {"n": number})
            )
            for number in range(3 * index)
        )
    )
    if index == 1:
        fault_injector(faulty).plan = FaultPlan.always(Fault.error_before(ConnectionRefusedError))
        await store.save_memory_state("held-1", {"n": 1})
        controller(store).breaker.force_open()
        await store.save_memory_state("held-2", {"n": 2})
    sink = PrometheusTaskTelemetrySink()
    for number in range(index):
        await sink.emit(pf_event("task_spawned", task_id=f"task-{number}"))
    await sink.emit(pf_event("task_completed", task_id="task-0", duration_ms=20.0 * index))
    return store


async def saves(store: Any, count: int) -> None:
    for number in range(count):
        await store.save_memory_state(f"key-{number}", {"n": number})


def forked() -> None:
    store = guard(
        InMemoryStateStore(), name="agents", config=GuardConfig(dead_letter=DeadLetterConfig(path=None))
    )
    asyncio.run(saves(store, 3))
    write_scrape_time_metrics()
    child = os.fork()
    if child == 0:
        asyncio.run(saves(store, 4))
        write_scrape_time_metrics()
        os._exit(0)
    assert os.waitpid(child, 0)[1] == 0


async def main() -> None:
    index, spill_dir = int(sys.argv[1]), Path(sys.argv[2])
    store = await workload(index, spill_dir)
    if sys.argv[3:] != ["timer"]:
        write_scrape_time_metrics()
    print(json.dumps(own_view()), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    del store  # held writes stay in the spill file; the process exits without draining them


if __name__ == "__main__":
    if sys.argv[1] == "fork":
        forked()
    else:
        asyncio.run(main())
