"""A capture tells its progress: every record it reads, by section, as ``guarded snapshot capture``
shows it."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from guarded.backends.memory import InMemoryStateStore
from guarded.codec import penguiflow_types
from guarded.snapshots import capture

from ._sessions import populate


@pytest.mark.asyncio
async def test_progress_counts_every_record_captured_by_section() -> None:
    store = InMemoryStateStore(record_types=penguiflow_types())
    await populate(store, random.Random(5), "s1", events=120)
    told: Counter[str] = Counter()
    async with await capture(
        store, session_id="s1", progress=lambda section, count: told.update({section: count})
    ) as captured:
        counts = {section: count for section, count in captured.snapshot.counts.items() if count}
    assert told["events"] >= 120
    assert dict(told) == counts
