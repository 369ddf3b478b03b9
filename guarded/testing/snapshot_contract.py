"""The SnapshotStore contract suite: every rule of :class:`guarded.snapshots.SnapshotStore`,
runnable against any backend.

Each contract needs a **fresh, empty** store (they list, page and ``gc`` the whole store), so the
runner takes a factory::

    report = await run_snapshot_contracts(lambda: FileSnapshotStore(tmp_path / uuid4().hex))
    assert report.ok, report

or, with pytest (:mod:`guarded.testing.pytest_snapshot_contract`), a ``snapshot_store`` fixture
(function-scoped: a new store per test)::

    @pytest.fixture
    def snapshot_store(tmp_path):
        return FileSnapshotStore(tmp_path)

    from guarded.testing.pytest_snapshot_contract import SnapshotStoreContract

    class TestFileSnapshots(SnapshotStoreContract):
        pass

A new backend (PostgreSQL: a fresh schema per store) passes when every contract passes.
Format-version behaviour (old formats migrate, too-new ones fail) needs a backend's own way to
write an old manifest, so each backend tests it itself (see ``tests/snapshots/test_migrations.py``).
"""

from __future__ import annotations

import inspect
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ._base import ContractViolation
from ._snapshot_checks import SNAPSHOT_REGISTRY, SnapshotContract, make_content
from .contract import ContractStatus

SNAPSHOT_CONTRACTS: tuple[SnapshotContract, ...] = tuple(SNAPSHOT_REGISTRY.values())
"""Every contract of the suite, in registration order."""


@dataclass(frozen=True, slots=True)
class SnapshotContractResult:
    """The outcome of one contract: ``PASSED``, ``FAILED`` (``message`` says how) or ``ERROR``."""

    contract: SnapshotContract
    status: ContractStatus
    message: str = ""
    exception: BaseException | None = None
    duration: float = 0.0


@dataclass(frozen=True, slots=True)
class SnapshotContractReport:
    """Results of a run; ``str(report)`` lists what did not pass."""

    results: tuple[SnapshotContractResult, ...]

    @property
    def ok(self) -> bool:
        return all(result.status is ContractStatus.PASSED for result in self.results)

    def __str__(self) -> str:
        broken = [r for r in self.results if r.status is not ContractStatus.PASSED]
        lines = [f"snapshot contracts: {len(self.results) - len(broken)} passed, {len(broken)} not"]
        lines.extend(f"  {r.status.value.upper()} {r.contract.name}: {r.message}" for r in broken)
        return "\n".join(lines)


async def run_snapshot_contract(store: Any, contract: SnapshotContract) -> SnapshotContractResult:
    """Run one contract against a fresh ``store``; never raises except on cancellation."""
    started = time.perf_counter()
    try:
        await contract.check(store)
    except ContractViolation as exc:
        return SnapshotContractResult(
            contract, ContractStatus.FAILED, str(exc), exc, time.perf_counter() - started
        )
    except Exception as exc:
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        message = f"{type(exc).__name__}: {exc}{where}"
        return SnapshotContractResult(
            contract, ContractStatus.ERROR, message, exc, time.perf_counter() - started
        )
    return SnapshotContractResult(contract, ContractStatus.PASSED, duration=time.perf_counter() - started)


async def run_snapshot_contracts(factory: Callable[[], Any | Awaitable[Any]]) -> SnapshotContractReport:
    """Run every contract, each against a new store from ``factory`` (sync or async)."""
    results = []
    for contract in SNAPSHOT_CONTRACTS:
        store = factory()
        if inspect.isawaitable(store):
            store = await store
        results.append(await run_snapshot_contract(store, contract))
    return SnapshotContractReport(tuple(results))


__all__ = [
    "SNAPSHOT_CONTRACTS",
    "SnapshotContract",
    "SnapshotContractReport",
    "SnapshotContractResult",
    "make_content",
    "run_snapshot_contract",
    "run_snapshot_contracts",
]
