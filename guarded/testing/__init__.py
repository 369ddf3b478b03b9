"""Testing tools for StateStore implementers and for code that uses a guarded store.

:func:`strict` makes every guard raise the caller's bugs instead of degrading (strict mode).

:func:`run_contracts` checks a store against every contract of the specification and returns a
:class:`ContractReport`; :class:`StateStoreContract` runs the same contracts as pytest tests
(imported lazily, so this package does not need pytest).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .contract import (
    CONTRACTS,
    Contract,
    ContractReport,
    ContractResult,
    ContractStatus,
    ContractViolation,
    run_contract,
    run_contracts,
    select_contracts,
)
from .faulty import (
    Ending,
    Fault,
    FaultInjector,
    FaultKind,
    FaultPlan,
    FaultRecord,
    FaultyStore,
    fault_injector,
)
from .strict import strict

if TYPE_CHECKING:
    from .pytest_contract import StateStoreContract


def __getattr__(name: str) -> Any:
    if name == "StateStoreContract":
        from .pytest_contract import StateStoreContract

        return StateStoreContract
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CONTRACTS",
    "Contract",
    "ContractReport",
    "ContractResult",
    "ContractStatus",
    "ContractViolation",
    "Ending",
    "Fault",
    "FaultInjector",
    "FaultKind",
    "FaultPlan",
    "FaultRecord",
    "FaultyStore",
    "StateStoreContract",
    "fault_injector",
    "run_contract",
    "run_contracts",
    "select_contracts",
    "strict",
]
