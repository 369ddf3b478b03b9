"""The clock-skew worker of tests/postgres/_skewed_worker.py on a Redis store.

``python -m tests.redis._skewed_redis_worker URL PREFIX SKEW_SECONDS NAME SPILL_PATH``: the same
commands and answers (:func:`tests.postgres._skewed_worker.serve`), through
``guard(RedisStateStore)`` on the server (or the cluster of the node) at ``URL`` under ``PREFIX``,
with this process's clock ``SKEW_SECONDS`` ahead.
"""

from __future__ import annotations

import asyncio
import sys

from tests.postgres._skewed_worker import serve, skew_clock
from tests.redis._processes import open_store


async def main(url: str, prefix: str, skew: float, name: str, spill: str) -> None:
    skew_clock(skew)
    backend = await open_store(url, prefix)
    try:
        await serve(backend, name, spill)
    finally:
        await backend.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]))
