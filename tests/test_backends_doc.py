"""docs/backends.md's minimal backend, run as written: it passes the contract suite, with the
capabilities it opts into (planner pauses, memory states ordered by logical time) offered, and a
guarded consume retried after a lost answer gets its payload again."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from guarded import controller, guard
from guarded.backend import HONOURS_IDEMPOTENCY_KEY
from guarded.pipeline.idempotency import idempotency_key
from guarded.testing import ContractStatus, run_contracts

DOC = Path(__file__).resolve().parents[1] / "docs" / "backends.md"
MARKER = "<!-- backends-doc: contract suite -->"


def _documented_store_class() -> type[Any]:
    text = DOC.read_text(encoding="utf-8")
    found = re.search(re.escape(MARKER) + r"\n```python\n(.*?)\n```", text, re.DOTALL)
    assert found, f"{DOC} has no python block after {MARKER}"
    namespace: dict[str, Any] = {"__name__": "backends_doc"}
    exec(compile(found.group(1), str(DOC), "exec"), namespace)
    store_class: type[Any] = namespace["DictStateStore"]
    return store_class


@pytest.mark.asyncio
async def test_the_documented_backend_passes_the_contract_suite() -> None:
    report = await run_contracts(_documented_store_class()())
    assert report.ok, report
    offered = {
        result.contract.capability for result in report.results if result.status is ContractStatus.PASSED
    }
    assert {"core", "planner_state", "memory_state"} <= offered


@pytest.mark.asyncio
async def test_the_documented_backend_answers_a_retried_consume_again() -> None:
    store_class = _documented_store_class()
    assert getattr(store_class, HONOURS_IDEMPOTENCY_KEY) is True
    store = store_class()
    await store.save_planner_state("token", {"step": 1})
    with idempotency_key("call-1"):
        assert await store.load_planner_state("token") == {"step": 1}
        assert await store.load_planner_state("token") == {"step": 1}  # the answer was lost: asked again
    with idempotency_key("call-2"):
        assert await store.load_planner_state("token") is None  # anyone else: consumed
    guarded = guard(store_class(), name="backends-doc")
    try:
        await guarded.save_planner_state("other", {"step": 2})
        assert await guarded.load_planner_state("other") == {"step": 2}
        assert await guarded.load_planner_state("other") is None
    finally:
        await controller(guarded).aclose()
