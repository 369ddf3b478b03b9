"""One process of the planner pause/resume tests: pause a run, or resume one, then report.

``python -m tests.interop._planner_worker pause --dsn DSN --schema SCHEMA [--spill FILE]``
runs the refund-desk ``ReactPlanner`` (tests/interop/_planner_support.py) until it pauses for
approval; ``... resume --token TOKEN [--user-input TEXT]`` resumes a run some other process
paused. Both open ``guard(PostgresStateStore.lazy(DSN))`` (with ``--redis-url URL [--prefix P]``:
``guard(HybridStateStore)``, the pauses in that Redis) with their own Prometheus registry,
leave through ``async with`` (flush, drain, spill what is left) and print one JSON line on
stdout: the planner's result, the guard's ``stats()``, its metrics in the Prometheus text format
and the log records of the ``guarded`` and ``penguiflow`` loggers. Everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from typing import Any

from penguiflow.planner import PlannerFinish, PlannerPause
from prometheus_client import CollectorRegistry, generate_latest

from guarded import controller

from . import _planner_support as support


class RecordKeeper(logging.Handler):
    """Keeps log records as JSON-ready dicts (message and the structured ``extra`` fields)."""

    FIELDS = ("event", "store", "method", "error_type", "outcome", "depth")

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        kept: dict[str, Any] = {
            "logger": record.name,
            "level": record.levelname,
            "message": record.getMessage(),
        }
        for field in self.FIELDS:
            if hasattr(record, field):
                kept[field] = getattr(record, field)
        self.records.append(kept)


def keep_logs() -> RecordKeeper:
    keeper = RecordKeeper()
    for name in ("guarded", "penguiflow"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(keeper)
    return keeper


async def pause(store: Any) -> dict[str, Any]:
    llm = support.ScriptedLLM(support.PAUSE_SCRIPT)
    result = await support.build_planner(store, llm).run(support.QUERY)
    if not isinstance(result, PlannerPause):
        return {"result": "not_paused", "detail": repr(result)}
    return {
        "result": "paused",
        "token": result.resume_token,
        "reason": result.reason,
        "payload": result.payload,
    }


async def resume(store: Any, token: str, user_input: str) -> dict[str, Any]:
    llm = support.ScriptedLLM(support.RESUME_SCRIPT)
    try:
        result = await support.build_planner(store, llm).resume(token, user_input=user_input)
    except KeyError as exc:
        return {"result": "resume_failed", "error_type": type(exc).__name__, "error": str(exc)}
    if not isinstance(result, PlannerFinish):
        return {"result": "not_finished", "detail": repr(result)}
    first_prompt = llm.prompt_text(0) if llm.prompts else ""
    return {
        "result": "finished",
        "reason": result.reason,
        "answer": support.final_answer(result.payload),
        "steps": [step.get("action", {}).get("next_node") for step in result.metadata.get("steps", [])],
        "prompt_has_user_input": support.RESUME_MARKER + user_input in first_prompt,
        "prompt_has_paused_observation": support.ORDER_STATUS in first_prompt,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    keeper = keep_logs()
    registry = CollectorRegistry()
    if args.redis_url:
        store = await support.guarded_hybrid(
            args.dsn, args.schema, args.redis_url, args.prefix, spill=args.spill, registry=registry
        )
    else:
        store = support.guarded_postgres(args.dsn, args.schema, spill=args.spill, registry=registry)
    async with store:
        if args.mode == "pause":
            report = await pause(store)
        else:
            report = await resume(store, args.token, args.user_input)
        report["held_before_close"] = held(store)
    report["held_after_close"] = held(store)
    report["calls"] = {
        f"{method}:{outcome}": count for (method, outcome), count in controller(store).stats().items()
    }
    report["metrics"] = generate_latest(registry).decode()
    report["logs"] = keeper.records
    return report


def held(store: Any) -> int | None:
    control = controller(store)
    parts = getattr(control, "parts", None)
    buffers = [part.dead_letters for part in parts.values()] if parts else [control.dead_letters]
    if all(buffer is None for buffer in buffers):
        return None
    return sum(buffer.depth for buffer in buffers if buffer is not None)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.interop._planner_worker")
    parser.add_argument("mode", choices=("pause", "resume"))
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--schema", required=True)
    parser.add_argument("--spill", default=None, help="dead-letter spill file (none: memory only)")
    parser.add_argument("--token", help="resume: the pause token")
    parser.add_argument(
        "--redis-url", default=None, help="guard(HybridStateStore), its hot part on this Redis"
    )
    parser.add_argument("--prefix", default="planner", help="the hybrid's Redis key prefix")
    parser.add_argument("--user-input", default=support.APPROVAL, help="resume: the human's answer")
    args = parser.parse_args(argv)
    if args.mode == "resume" and not args.token:
        parser.error("resume needs --token")
    return args


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse(sys.argv[1:])))), flush=True)
