"""Every Python block of README.md and of the guides in :data:`PAGES` runs, so a snippet cannot rot.

Each ```` ```python ```` block (``py``, ``python3`` and ``pycon`` too) is preceded by a marker
naming how it runs::

    <!-- readme-test: run NAME (what it runs against) -->
    <!-- readme-test: not run: REASON -->

``run NAME`` names a runner of :data:`RUNNERS`: it gives the block what a fragment leaves to
the reader (a DSN, a backend, PenguiFlow nodes; real PostgreSQL and PenguiFlow wherever the
block uses them), executes it (top-level ``await`` allowed) and checks what it did. A block with
no marker, an unknown runner or ``not run`` without a reason fails
:func:`test_every_python_block_is_run_or_marked_not_run_with_a_reason`; a runner no block names
fails it too.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from opentelemetry import metrics, trace
from penguiflow import Message, Node, PenguiFlow
from penguiflow.planner import PlannerFinish
from penguiflow.state import StoredEvent

from guarded import GuardedStore
from guarded.backends.postgres import PostgresStateStore
from guarded.testing.postgres import EmbeddedPostgres
from tests.interop._planner_support import (
    FINAL_ANSWER,
    PAUSE_SCRIPT,
    RESUME_SCRIPT,
    ScriptedLLM,
    refund_catalog,
)
from tests.interop._session_support import joining_summarizer, memory_config
from tests.otlp.receiver import OtlpReceiver

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = (
    README,
    REPO / "docs" / "getting-started.md",
    REPO / "docs" / "guide.md",
    REPO / "docs" / "penguiflow.md",
    REPO / "docs" / "observability.md",
)
"""The documents whose every Python block is run or marked not run (the README's long material
moved to these guides, with its blocks)."""
PYTHON = frozenset({"python", "py", "python3", "pycon"})
MARKER = re.compile(r"^\s*<!--\s*readme-test:\s*(?P<body>.*?)\s*-->\s*$")
RUN = re.compile(r"^run (?P<name>\w+)\b")
NOT_RUN = re.compile(r"^not run:\s*(?P<reason>\S.*)$")


@dataclass(frozen=True)
class Block:
    """A Python block of a document: where its opening fence is, its code, its marker."""

    line: int
    source: str
    marker: str | None
    document: str = "README.md"

    @property
    def runner(self) -> str | None:
        found = RUN.match(self.marker or "")
        return found["name"] if found else None

    @property
    def not_run_reason(self) -> str | None:
        found = NOT_RUN.match(self.marker or "")
        return found["reason"] if found else None

    @property
    def id(self) -> str:
        return f"{self.document}-line-{self.line}-{self.runner or 'not-run'}"


def python_blocks(text: str, document: str = "README.md") -> list[Block]:
    """Every fenced Python block of ``text`` (indented ones in list items too), in order."""
    lines = text.splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        stripped = lines[index].strip()
        if not stripped.startswith("```"):
            index += 1
            continue
        language = stripped[3:].strip().lower()
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if language in PYTHON:
            before = next((line for line in reversed(lines[:index]) if line.strip()), "")
            marker = MARKER.match(before)
            source = textwrap.dedent("\n".join(lines[index + 1 : end]))
            found.append(Block(index + 1, source, marker["body"] if marker else None, document))
        index = end + 1
    return found


BLOCKS = [
    block
    for page in PAGES
    for block in python_blocks(page.read_text(encoding="utf-8"), str(page.relative_to(REPO)))
]


async def execute(block: Block, namespace: dict[str, Any], *, source: str | None = None) -> None:
    """Run the block's code (or ``source``, a version of it) in ``namespace``."""
    code = compile(
        source or block.source, f"{block.document}:{block.line}", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    )
    result = eval(code, namespace)
    if inspect.iscoroutine(result):
        await result


@dataclass
class Env:
    """What a runner may use: a PostgreSQL server (started on first use), a temporary directory."""

    request: pytest.FixtureRequest
    tmp_path: Path
    monkeypatch: pytest.MonkeyPatch

    @asynccontextmanager
    async def database(self) -> AsyncIterator[str]:
        """The DSN of a new database of the embedded server, dropped afterwards (a block that
        uses the ``public`` schema has it to itself)."""
        server: EmbeddedPostgres = self.request.getfixturevalue("pg_server")
        name = f"readme_{uuid.uuid4().hex[:12]}"
        admin = await asyncpg.connect(server.dsn)
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        try:
            yield f"postgresql://{server.user}@{server.host}:{server.port}/{name}"
        finally:
            admin = await asyncpg.connect(server.dsn)
            try:
                await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            finally:
                await admin.close()


async def _parse(message: Message, ctx: Any) -> Message:
    return message.model_copy(update={"payload": str(message.payload).strip()})


async def _answer(message: Message, ctx: Any) -> str:
    return f"echo: {message.payload}"


# --- the runners -------------------------------------------------------------------------------------


async def first_steps(block: Block, env: Env) -> None:
    """A whole program (``asyncio.run``): run in a process of its own, its printed lines checked."""
    completed = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", block.source],
        cwd=env.tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines() == ["{'turns': ['hi']}", "['node_success']", "1"]


async def intro(block: Block, env: Env) -> None:
    given: list[object] = []

    def create(*adjacencies: object, state_store: object) -> object:
        """Stands for ``penguiflow.create`` (the block's ``...`` is its flow)."""
        given.append(state_store)
        return object()

    async with env.database() as dsn:
        await execute(block, {"dsn": dsn, "create": create})
    assert len(given) == 1
    assert isinstance(given[0], GuardedStore)


async def using_guard(block: Block, env: Env) -> None:
    namespace: dict[str, Any] = {
        "planner": Node(_parse, name="planner"),
        "executor": Node(_answer, name="executor"),
    }
    async with env.database() as dsn:
        namespace["dsn"] = dsn
        await execute(block, namespace)
    assert isinstance(namespace["flow"], PenguiFlow)
    assert namespace["controller"](namespace["store"]).breaker.state.value == "closed"


async def nothing_lost(block: Block, env: Env) -> None:
    event = StoredEvent(
        trace_id="trace-readme",
        ts=1_700_000_000.0,
        kind="node_success",
        node_name="n",
        node_id="n-1",
        payload={"i": 1},
    )
    key, state = "tenant:user:session", {"summary": "kept"}
    async with env.database() as dsn:
        backend = await PostgresStateStore.connect(dsn, stats_interval=None)
        await execute(block, {"backend": backend, "event": event, "key": key, "state": state})
        reader = await PostgresStateStore.connect(dsn, stats_interval=None)
        try:
            assert await reader.load_memory_state(key) == state
            assert [found.kind for found in await reader.load_history("trace-readme")] == ["node_success"]
        finally:
            await reader.close()


AGENT_DIR = "/var/lib/agent/"


async def penguiflow(block: Block, env: Env) -> None:
    assert AGENT_DIR in block.source, f"the block no longer writes under {AGENT_DIR}: update this runner"
    agent_dir = env.tmp_path / "agent"
    agent_dir.mkdir()
    sent: list[str] = []
    namespace: dict[str, Any] = {
        "parse_node": Node(_parse, name="parse"),
        "answer_node": Node(_answer, name="answer"),
        "llm": ScriptedLLM((*PAUSE_SCRIPT, *RESUME_SCRIPT)),
        "catalog": refund_catalog(),
        "session_id": "session-1",
        "tenant_id": "tenant-a",
        "user_id": "user-1",
        "memory_config": memory_config(),
        "summarize": joining_summarizer,
    }

    def send_to_human(token: str) -> None:
        """Stands for the application's UI; the human's answer resumes this token."""
        sent.append(token)
        namespace["token"] = token

    namespace["send_to_human"] = send_to_human
    async with env.database() as dsn:
        namespace["dsn"] = dsn
        await execute(block, namespace, source=block.source.replace(AGENT_DIR, f"{agent_dir}/"))
    assert len(sent) == 1
    assert isinstance(namespace["final"], PlannerFinish)
    assert FINAL_ANSWER in str(namespace["final"].payload)
    assert [event.kind for event in namespace["history"]][:2] == ["node_start", "node_success"]
    assert list(agent_dir.glob("dlq-agents.sqlite*")), "the spill file is not where the config put it"


async def contract_suite(block: Block, env: Env) -> None:
    package = env.tmp_path / "mypackage"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "stores.py").write_text(
        "from guarded.backends.memory import InMemoryStateStore as MyStateStore\n"
    )
    (env.tmp_path / "test_my_store.py").write_text(block.source)
    completed = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_store.py"],
        cwd=env.tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO), str(env.tmp_path)))},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert re.search(r"\d+ passed", completed.stdout), completed.stdout
    assert "failed" not in completed.stdout


async def otlp(block: Block, env: Env) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            env.monkeypatch.delenv(name)
    tracer_provider, meter_provider = trace.get_tracer_provider(), metrics.get_meter_provider()
    namespace: dict[str, Any] = {}
    await execute(block, namespace)  # no endpoint: OTLP is off, and shutdown() is harmless
    assert not namespace["setup"].exporting
    assert trace.get_tracer_provider() is tracer_provider
    assert metrics.get_meter_provider() is meter_provider
    with OtlpReceiver() as receiver:  # an endpoint: in a process of its own (globals are set once)
        completed = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", block.source],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert completed.returncode == 0, completed.stderr


RUNNERS: dict[str, Callable[[Block, Env], Awaitable[None]]] = {
    runner.__name__: runner
    for runner in (first_steps, intro, using_guard, nothing_lost, penguiflow, contract_suite, otlp)
}


# --- the tests ---------------------------------------------------------------------------------------


def test_every_python_block_is_run_or_marked_not_run_with_a_reason() -> None:
    assert any(block.document == "README.md" for block in BLOCKS), "README.md has no Python block"
    problems = []
    for block in BLOCKS:
        where = f"{block.document} line {block.line}"
        if block.marker is None:
            problems.append(f"{where}: no '<!-- readme-test: ... -->' marker before the block")
        elif block.runner is None and block.not_run_reason is None:
            problems.append(f"{where}: the marker says neither 'run NAME' nor 'not run: REASON'")
        elif block.runner is not None and block.runner not in RUNNERS:
            problems.append(f"{where}: no runner {block.runner!r} (known: {', '.join(RUNNERS)})")
    named = [block.runner for block in BLOCKS if block.runner is not None]
    problems += [f"runner {name!r} is named by no block" for name in RUNNERS if name not in named]
    problems += [
        f"runner {name!r} is named by more than one block" for name in set(named) if named.count(name) > 1
    ]
    assert not problems, "\n".join(problems)


def test_the_parser_finds_every_kind_of_python_fence() -> None:
    text = (
        "a\n```python\nx = 1\n```\n```\nnot python\n```\n"
        "  <!-- readme-test: run a -->\n  ```py\n  y = 2\n  ```\n"
    )
    assert python_blocks(text) == [Block(2, "x = 1", None), Block(9, "y = 2", "run a")]


@pytest.mark.asyncio
@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
async def test_readme_block_runs(
    block: Block, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if block.runner is None:
        reason = block.not_run_reason
        assert reason, f"line {block.line}: neither run nor marked not run with a reason"
        pytest.skip(f"{block.document} line {block.line} is marked not run: {reason}")
    runner = RUNNERS.get(block.runner)
    assert runner is not None, f"line {block.line}: no runner {block.runner!r}"
    await runner(block, Env(request, tmp_path, monkeypatch))
