"""``python -m benchmarks.protocol_gap`` keeps running: its server-free half on token sizes.

Not a timed test (figures this small mean nothing); the half on a server shares the protocol
section's recorder and replay, which the bench's smoke test runs.
"""

from __future__ import annotations

import asyncio

from benchmarks import protocol_gap


def test_null_backend_half_reports_warm_and_evicted_caches() -> None:
    null = asyncio.run(protocol_gap.null_backend(("load_memory_state",), rounds=1, per_round=2))

    by_caches = null["load_memory_state"]
    assert set(by_caches) == {"warm", "evicted"}
    assert all(len(series.wall_us) == 1 for entry in by_caches.values() for series in entry.values())
    report = protocol_gap.format_report({}, null, per_round=2)
    assert "caches evicted" in report
    assert report.count("load_memory_state") == 1
