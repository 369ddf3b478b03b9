"""PenguiFlow finds and uses the artifact store of ``guard(PostgresStateStore)``.

PenguiFlow discovers artifacts through ``penguiflow.artifacts.discover_artifact_store(state_store)``
(``state_store.artifact_store`` when it satisfies the ``ArtifactStore`` protocol); ReactPlanner
does so when given only a ``state_store`` (spec 000, "SupportsArtifacts"; spec 004, artifacts
stored by reference). Tools reach it through the ``ScopedArtifacts`` facade, which enforces the
tenant / user / session recorded in each ref.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import asyncpg
import pytest
from penguiflow.artifacts import (
    ArtifactRef,
    ArtifactScope,
    ArtifactStore,
    InMemoryArtifactStore,
    ScopedArtifacts,
    discover_artifact_store,
)
from penguiflow.planner import ReactPlanner
from penguiflow.state.adapters import get_artifact_store

from guarded import controller
from guarded.backends.postgres import PostgresStateStore
from guarded.guard import GuardedArtifactStore
from tests.postgres.conftest import StoreFactory

from .support import guarded_postgres

pytestmark = pytest.mark.asyncio

ACME_ALICE = ArtifactScope(tenant_id="acme", user_id="alice", session_id="s1", trace_id="t1")
ACME_BOB = ArtifactScope(tenant_id="acme", user_id="bob", session_id="s2", trace_id="t2")
PDF = b"%PDF-1.7 \x00\x01\xff binary body"


class UnusedLLM:
    """ReactPlanner needs an LLM client to be built; these tests never plan."""

    async def complete(self, **kwargs: Any) -> str:
        raise AssertionError("the planner must not call the LLM in this test")


async def test_penguiflow_discovers_the_guarded_artifact_store(make_store: StoreFactory) -> None:
    async with guarded_postgres(make_store) as store:
        found = discover_artifact_store(store)
        assert found is store.artifact_store
        assert isinstance(found, GuardedArtifactStore)
        assert isinstance(found, ArtifactStore)
        backend = controller(store).store
        assert isinstance(backend, PostgresStateStore)
        assert controller(found).store is backend.artifact_store  # the PostgreSQL artifact store
        assert get_artifact_store(store) is found
        planner = ReactPlanner(llm_client=UnusedLLM(), catalog=[], state_store=store)
        assert planner.artifact_store is found


def by_id(refs: Sequence[ArtifactRef]) -> list[ArtifactRef]:
    return sorted(refs, key=lambda ref: ref.id)


async def test_artifacts_behave_like_penguiflows_own_store(
    make_store: StoreFactory, raw: asyncpg.Connection, schema_name: str
) -> None:
    """Every call gives the answer PenguiFlow's ``InMemoryArtifactStore`` gives for the same calls."""
    reference = InMemoryArtifactStore()
    rows = f'SELECT artifact_id, size_bytes, mime_type FROM "{schema_name}".artifacts ORDER BY artifact_id'
    async with guarded_postgres(make_store) as store:
        artifacts = discover_artifact_store(store)
        assert artifacts is not None

        async def both(call: Callable[[Any], Any]) -> Any:
            ours, theirs = await call(artifacts), await call(reference)
            assert ours == theirs
            return ours

        pdf = await both(
            lambda s: s.put_bytes(
                PDF,
                mime_type="application/pdf",
                filename="report.pdf",
                namespace="tool.pdf",
                scope=ACME_ALICE,
                meta={"pages": 2, "tool": "pdf_reader"},
            )
        )
        assert isinstance(pdf, ArtifactRef)
        assert pdf.id == f"tool_pdf_{hashlib.sha256(PDF).hexdigest()[:12]}"
        assert (pdf.size_bytes, pdf.sha256) == (len(PDF), hashlib.sha256(PDF).hexdigest())
        assert pdf.scope == ACME_ALICE
        assert pdf.source == {"pages": 2, "tool": "pdf_reader"}
        note = await both(lambda s: s.put_text("naïve café ✓", namespace="notes", scope=ACME_BOB))
        assert note.mime_type == "text/plain"
        unscoped = await both(lambda s: s.put_bytes(b"\x89PNG", mime_type="image/png"))
        assert unscoped.id.startswith("art_")
        assert unscoped.scope is None
        assert await both(lambda s: s.put_bytes(PDF, namespace="tool.pdf")) == pdf  # same content: same ref

        assert await both(lambda s: s.get(pdf.id)) == PDF
        assert await both(lambda s: s.get(note.id)) == "naïve café ✓".encode()
        assert await both(lambda s: s.get_ref(note.id)) == note
        assert await both(lambda s: s.exists(unscoped.id)) is True
        assert await both(lambda s: s.get("art_000000000000")) is None

        async def listed(scope: ArtifactScope | None) -> list[ArtifactRef]:
            ours, theirs = await artifacts.list(scope=scope), await reference.list(scope=scope)
            assert by_id(ours) == by_id(theirs)
            return by_id(ours)

        assert await listed(None) == by_id([pdf, note, unscoped])
        assert await listed(ArtifactScope(tenant_id="acme")) == by_id([pdf, note])
        assert await listed(ArtifactScope(session_id="s2")) == [note]
        assert await listed(ArtifactScope(tenant_id="acme", user_id="alice", trace_id="t1")) == [pdf]
        assert await listed(ArtifactScope(tenant_id="globex")) == []
        assert [tuple(row) for row in await raw.fetch(rows)] == sorted(
            (ref.id, ref.size_bytes, ref.mime_type) for ref in (pdf, note, unscoped)
        )

        assert await both(lambda s: s.delete(pdf.id)) is True
        assert await both(lambda s: s.delete(pdf.id)) is False
        assert await both(lambda s: s.get(pdf.id)) is None
        assert await both(lambda s: s.get_ref(pdf.id)) is None
        assert await both(lambda s: s.exists(pdf.id)) is False
        assert [row["artifact_id"] for row in await raw.fetch(rows)] == sorted([note.id, unscoped.id])
        # every answer came from PostgreSQL: nothing was served by a fallback
        assert {outcome for _, outcome in controller(artifacts).stats()} == {"ok", "not_found"}


def facade(store: ArtifactStore, scope: ArtifactScope) -> ScopedArtifacts:
    fields: Mapping[str, str | None] = scope.model_dump()
    return ScopedArtifacts(store, **fields)


async def test_the_tool_facade_enforces_the_scope_stored_in_postgres(make_store: StoreFactory) -> None:
    async with guarded_postgres(make_store) as store:
        artifacts = discover_artifact_store(store)
        assert artifacts is not None
        alice, bob = facade(artifacts, ACME_ALICE), facade(artifacts, ACME_BOB)

        chart = await alice.upload(
            b"chart bytes", mime_type="image/png", filename="chart.png", namespace="plot"
        )
        summary = await alice.upload("a long summary", namespace="summary")
        assert chart.scope == summary.scope == ACME_ALICE
        assert summary.mime_type == "text/plain"

        assert await alice.download(chart.id) == b"chart bytes"
        assert await alice.get_metadata(summary.id) == summary
        assert by_id(await alice.list()) == by_id([chart, summary])
        assert await alice.exists(chart.id) is True

        # Bob's facade reads the scope back from PostgreSQL and is refused Alice's artifacts.
        assert await bob.download(chart.id) is None
        assert await bob.get_metadata(chart.id) is None
        assert await bob.exists(chart.id) is False
        assert await bob.delete(chart.id) is False
        assert await bob.list() == []

        assert await alice.delete(chart.id) is True
        assert await artifacts.exists(chart.id) is False
        assert await alice.list() == [summary]
