"""The StateStore contract suite: every behaviour the specification states, runnable against any store.

Each :class:`Contract` checks one rule of spec 000 ("Required Methods", "Optional Duck-Typed
Methods", "Method Contracts & Semantics", "Testing Your Implementation") or spec 001, on a store
given as is. Contracts write only under fresh ids (``contract-<uuid>-...``), so they can run
against a shared, non-empty store such as a real database; what they write stays there. A
contract whose capability the store does not offer is reported "not offered", never failed; the
required core is always checked.

    report = await run_contracts(MyStore())
    print(report)
    assert report.ok, report.failed

For pytest, see :class:`guarded.testing.StateStoreContract`.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from difflib import get_close_matches
from enum import Enum
from typing import Any

from ..protocol import CAPABILITIES, capabilities
from . import (
    _contracts_artifacts,
    _contracts_core,
    _contracts_planner,
    _contracts_sessions,
    _contracts_steering,
)
from ._base import REGISTRY, Check, Contract, ContractViolation

_CHECK_MODULES = (
    _contracts_core,
    _contracts_planner,
    _contracts_sessions,
    _contracts_steering,
    _contracts_artifacts,
)
"""Importing these modules registers their contracts."""
_CAPABILITY_ORDER = [capability.name for capability in CAPABILITIES]

CONTRACTS: tuple[Contract, ...] = tuple(
    sorted(REGISTRY.values(), key=lambda item: _CAPABILITY_ORDER.index(item.capability))
)
"""Every contract of the suite, grouped by capability in the order of ``CAPABILITIES``."""

DEFAULT_TIMEOUT = 30.0
"""Seconds one contract may take; a store that blocks longer fails (spec 000: MUST NOT block indefinitely)."""


class ContractStatus(str, Enum):
    """Outcome of one contract."""

    PASSED = "passed"
    FAILED = "failed"
    NOT_OFFERED = "not offered"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class ContractResult:
    """The outcome of running one contract; ``message`` explains anything but a pass.

    ``FAILED`` means the store broke the contract (``message`` says how); ``ERROR`` means the
    store raised where the contract does not expect it (``exception`` is what it raised).
    """

    contract: Contract
    status: ContractStatus
    message: str = ""
    exception: BaseException | None = None
    duration: float = 0.0

    @property
    def name(self) -> str:
        """The contract's name, e.g. ``planner_state.consume_once``."""
        return self.contract.name


@dataclass(frozen=True, slots=True)
class ContractReport:
    """Results of a run, in suite order; ``str(report)`` is a readable summary."""

    store_type: str
    results: tuple[ContractResult, ...]

    def _with(self, status: ContractStatus) -> list[ContractResult]:
        return [result for result in self.results if result.status is status]

    @property
    def passed(self) -> list[ContractResult]:
        """Contracts the store honours."""
        return self._with(ContractStatus.PASSED)

    @property
    def failed(self) -> list[ContractResult]:
        """Contracts the store broke (see also :attr:`errors`)."""
        return self._with(ContractStatus.FAILED)

    @property
    def errors(self) -> list[ContractResult]:
        """Contracts during which the store raised unexpectedly."""
        return self._with(ContractStatus.ERROR)

    @property
    def not_offered(self) -> list[ContractResult]:
        """Contracts of capabilities (or methods) the store does not offer."""
        return self._with(ContractStatus.NOT_OFFERED)

    @property
    def ok(self) -> bool:
        """Whether every offered contract passed."""
        return not self.failed and not self.errors

    def __getitem__(self, name: str) -> ContractResult:
        for result in self.results:
            if result.name == name:
                return result
        raise KeyError(name)

    def summary(self) -> str:
        """One line of counts: passed, failed, errors, not offered."""
        return (
            f"{len(self.passed)} passed, {len(self.failed)} failed, {len(self.errors)} errors, "
            f"{len(self.not_offered)} not offered"
        )

    def __str__(self) -> str:
        lines = [f"contracts of {self.store_type}: {self.summary()}"]
        unoffered: dict[str, list[ContractResult]] = {}
        for result in self.not_offered:
            unoffered.setdefault(result.message, []).append(result)
        for result in self.results:
            if result.status is ContractStatus.NOT_OFFERED:
                group = unoffered[result.message]
                if result is group[0]:
                    what = (
                        result.name
                        if len(group) == 1
                        else f"{len(group)} {result.contract.capability} contracts"
                    )
                    lines.append(f"  -       {what}: {result.message}")
                continue
            label = "passed" if result.status is ContractStatus.PASSED else result.status.value.upper()
            lines.append(f"  {label:<7} {result.name}")
            if result.status in (ContractStatus.FAILED, ContractStatus.ERROR):
                lines.extend(f"            {part}" for part in result.message.splitlines())
        broken = [result.name for result in (*self.failed, *self.errors)]
        lines.append(f"not passed: {', '.join(broken)}" if broken else "every offered contract passed")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form: store type, summary counts and one entry per contract."""
        return {
            "store": self.store_type,
            "ok": self.ok,
            "summary": {status.value: len(self._with(status)) for status in ContractStatus},
            "results": [
                {
                    "name": result.name,
                    "capability": result.contract.capability,
                    "status": result.status.value,
                    "message": result.message,
                    "duration_seconds": round(result.duration, 6),
                }
                for result in self.results
            ],
        }


def select_contracts(only: Iterable[str] | None = None) -> tuple[Contract, ...]:
    """The contracts named in ``only`` (contract or capability names), or all of them.

    Raises ``ValueError`` for a name that is neither, with close matches.
    """
    if only is None:
        return CONTRACTS
    wanted = list(only)
    known = {item.name for item in CONTRACTS} | {item.capability for item in CONTRACTS}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        hints = [
            f"{name!r} (did you mean {', '.join(get_close_matches(name, known, 3)) or '?'})"
            for name in unknown
        ]
        raise ValueError(f"unknown contract or capability: {'; '.join(hints)}")
    return tuple(item for item in CONTRACTS if item.name in wanted or item.capability in wanted)


def _store_type(store: object) -> str:
    return f"{type(store).__module__}.{type(store).__qualname__}"


def _resolve(store: object, path: str) -> bool:
    target: object = store
    for part in path.split("."):
        target = getattr(target, part, None)
        if target is None:
            return False
    return True


def not_offered_reason(store: object, contract: Contract) -> str | None:
    """Why ``contract`` does not apply to ``store``, or ``None`` when it does."""
    report = capabilities(store)
    [status] = [status for status in report.statuses if status.capability.name == contract.capability]
    if status.missing and not status.capability.required:
        detail = f" (PARTIAL: missing {', '.join(status.missing)})" if status.partial else ""
        return f"capability {contract.capability} not offered by {report.store_type}{detail}"
    if contract.capability == "artifacts" and getattr(store, "artifact_store", None) is None:
        return f"capability artifacts not offered by {report.store_type} (artifact_store is None)"
    for path in contract.requires:
        if not _resolve(store, path):
            return f"{path} not offered by {report.store_type}"
    return None


def _missing_core(store: object) -> str | None:
    missing = [
        name for name in ("save_event", "load_history", "save_remote_binding") if not hasattr(store, name)
    ]
    if not missing:
        return None
    return (
        f"the store lacks {', '.join(missing)}; every StateStore must implement save_event, load_history and "
        "save_remote_binding (spec 000 'Required Methods')"
    )


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (raised at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


async def run_contract(
    store: object, contract: Contract, *, per_contract_timeout: float = DEFAULT_TIMEOUT
) -> ContractResult:
    """Run one contract against ``store``; never raises except on cancellation."""
    reason = not_offered_reason(store, contract)
    if reason is not None:
        return ContractResult(contract, ContractStatus.NOT_OFFERED, reason)
    if contract.capability == "core" and (missing := _missing_core(store)):
        return ContractResult(contract, ContractStatus.FAILED, missing)
    started = time.perf_counter()
    deadline = asyncio.timeout(per_contract_timeout)
    try:
        async with deadline:
            await contract.check(store)
    except ContractViolation as exc:
        return ContractResult(contract, ContractStatus.FAILED, str(exc), exc, time.perf_counter() - started)
    except TimeoutError as exc:
        elapsed = time.perf_counter() - started
        if deadline.expired():
            message = (
                f"did not finish within {per_contract_timeout:g}s; store methods MUST NOT block indefinitely "
                "(spec 000 'Required Methods' §1; spec 001 'Timeouts, cancellation, and backpressure')"
            )
            return ContractResult(contract, ContractStatus.FAILED, message, exc, elapsed)
        return ContractResult(contract, ContractStatus.ERROR, _describe(exc), exc, elapsed)
    except Exception as exc:
        return ContractResult(
            contract, ContractStatus.ERROR, _describe(exc), exc, time.perf_counter() - started
        )
    return ContractResult(contract, ContractStatus.PASSED, duration=time.perf_counter() - started)


async def run_contracts(
    store: object, *, only: Iterable[str] | None = None, per_contract_timeout: float = DEFAULT_TIMEOUT
) -> ContractReport:
    """Run the suite (or the contracts and capabilities named in ``only``) against ``store``, one at a time.

    Raises ``ValueError`` when ``only`` names an unknown contract; store failures never raise,
    they are reported.
    """
    selected = select_contracts(only)
    results = [
        await run_contract(store, item, per_contract_timeout=per_contract_timeout) for item in selected
    ]
    return ContractReport(_store_type(store), tuple(results))


__all__ = [
    "CONTRACTS",
    "DEFAULT_TIMEOUT",
    "Check",
    "Contract",
    "ContractReport",
    "ContractResult",
    "ContractStatus",
    "ContractViolation",
    "not_offered_reason",
    "run_contract",
    "run_contracts",
    "select_contracts",
]
