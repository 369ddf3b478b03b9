"""A worker process saving or resuming planner pauses on Redis, for the consume-once tests across
processes. Two commands, each through ``guard(RedisStateStore)`` on the server (or the cluster of
the node) at ``URL`` under key prefix ``PREFIX``, with its own spill file ``SPILL``:

``python -m tests.redis._pause_worker resume URL PREFIX TOKENS PER_TOKEN SPILL``: prints ``ready``
and waits for a line ``go START`` on stdin and then for the wall-clock time ``START`` (so every
worker starts at once); then makes ``PER_TOKEN``
concurrent resumes of each of the ``TOKENS`` tokens ``pause-0`` ... and prints one JSON line:
``{"got": {token: how many resumes returned its payload}, "wrong": [payloads not the one saved]}``.

``python -m tests.redis._pause_worker hold URL PREFIX TOKENS 0 SPILL``: partitioned from Redis
(fault injection over a real store: every pause call fails with a connection error), saves every
token (``{"by": "b", "version": 1}``: held in the spill file), prints ``{"held": N}`` and waits to
be killed.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from guarded.backends.redis import RedisStateStore
from guarded.guard import controller, guard
from tests.postgres.test_pauses_across_workers import worker_config
from tests.redis._processes import open_store
from tests.support.pause_partition import PausePartition


def pause_payload(token: str) -> dict[str, Any]:
    """What the resume test saves under ``token``."""
    return {"token": token, "trajectory": {"steps": [token]}}


class PartitionedRedisStore(PausePartition, RedisStateStore):
    """A real Redis store whose pause calls fail with a connection error while ``down``."""


async def resume_all(store: Any, tokens: int, per_token: int) -> dict[str, Any]:
    names = [f"pause-{index}" for index in range(tokens)]
    results = await asyncio.gather(
        *(store.load_planner_state(token) for token in names for _ in range(per_token))
    )
    got: Counter[str] = Counter()
    wrong: list[Any] = []
    for result in results:
        if result is None:
            continue
        if isinstance(result, dict) and result == pause_payload(str(result.get("token"))):
            got[result["token"]] += 1
        else:
            wrong.append(result)
    return {"got": got, "wrong": wrong}


async def main(command: str, url: str, prefix: str, tokens: int, per_token: int, spill: str) -> None:
    backend = await open_store(url, prefix, PartitionedRedisStore)
    store = guard(backend, name="pause-worker", registry=CollectorRegistry(), **worker_config(Path(spill)))
    if command == "hold":
        backend.down = True
        for index in range(tokens):
            await store.save_planner_state(f"pause-{index}", {"by": "b", "version": 1})
        held = controller(store).dead_letters
        assert held is not None
        print(json.dumps({"held": held.depth}), flush=True)
        await asyncio.sleep(3600)  # until the test kills this process
    loop = asyncio.get_running_loop()
    async with store:
        print("ready", flush=True)
        command_line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
        if command_line[:1] == ["go"]:
            await asyncio.sleep(max(0.0, float(command_line[1]) - time.time()))
            print(json.dumps(await resume_all(store, tokens, per_token)), flush=True)
    await backend.close()


if __name__ == "__main__":
    command, url, prefix, tokens, per_token, spill = sys.argv[1:7]
    asyncio.run(main(command, url, prefix, int(tokens), int(per_token), spill))
