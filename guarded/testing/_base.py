"""Building blocks of the contract suite: the ``Contract`` record, its registry and check helpers.

The checks themselves live in the ``_contracts_*`` modules; :mod:`guarded.testing.contract`
collects them and runs them.
"""

from __future__ import annotations

import math
import reprlib
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from ..protocol import CAPABILITIES

T = TypeVar("T")

Check = Callable[[Any], Awaitable[None]]
"""``async def check(store) -> None``: returns when the store honours the contract, raises
:class:`ContractViolation` when it does not."""


class ContractViolation(AssertionError):
    """A store broke a contract; the message says what the spec requires and what the store did."""


@dataclass(frozen=True, slots=True)
class Contract:
    """One behaviour the specification requires of a store.

    ``capability`` is a name from :data:`guarded.protocol.CAPABILITIES`; a store that does not
    offer it is reported "not offered", never failed. ``requires`` lists further attributes the
    contract needs beyond the capability (legacy aliases, ``artifact_store.list``), as dotted
    paths from the store.
    """

    name: str
    capability: str
    description: str
    check: Check
    requires: tuple[str, ...] = ()


_CAPABILITY_NAMES = frozenset(capability.name for capability in CAPABILITIES)
REGISTRY: dict[str, Contract] = {}
"""Every contract by name, in registration order (the order reports list them)."""


def register(contract: Contract) -> Contract:
    """Add ``contract`` to :data:`REGISTRY`; names are unique and capabilities must exist."""
    if contract.capability not in _CAPABILITY_NAMES:
        raise ValueError(f"contract {contract.name!r}: unknown capability {contract.capability!r}")
    if contract.name in REGISTRY:
        raise ValueError(f"contract {contract.name!r} is already registered")
    REGISTRY[contract.name] = contract
    return contract


def contract(
    name: str, capability: str, description: str, *, requires: tuple[str, ...] = ()
) -> Callable[[Check], Check]:
    """Register the decorated ``async def check(store)`` as contract ``name``."""

    def decorate(check: Check) -> Check:
        register(Contract(name, capability, description, check, requires))
        return check

    return decorate


def unique(label: str) -> str:
    """A fresh id such as ``contract-3f2a9c1b7d4e-trace``, so checks can share a non-empty store."""
    return f"contract-{uuid.uuid4().hex[:12]}-{label}"


def violation(message: str) -> ContractViolation:
    """Build the exception a check raises."""
    return ContractViolation(message)


_repr = reprlib.Repr()
_repr.maxstring = 80
_repr.maxother = 80
_repr.maxlist = 8
_repr.maxdict = 6


def show(value: Any) -> str:
    """A bounded ``repr`` for messages."""
    return _repr.repr(value)


async def survive(what: str, call: Awaitable[T], rule: str) -> T:
    """Await ``call``; an exception from it is itself the violation (``rule`` says why)."""
    try:
        return await call
    except Exception as exc:
        raise violation(f"{what} raised {type(exc).__name__}: {exc}; {rule}") from exc


def plain(value: Any) -> Any:
    """The value of an enum member, else ``value`` (stores may return ours or PenguiFlow's enums)."""
    return value.value if isinstance(value, Enum) else value


def difference(expected: Any, actual: Any, path: str) -> str | None:
    """Where ``actual`` first differs from the JSON-like ``expected``, or ``None`` when identical.

    Stricter than ``==``: ``1`` and ``1.0`` differ, as do ``True`` and ``1``; any mapping may
    stand for a dict and a tuple for a list, since stores may return read-only views.
    """
    if isinstance(expected, Mapping):
        if not isinstance(actual, Mapping):
            return f"{path} came back as {type(actual).__name__} {show(actual)}, expected a mapping"
        missing = [key for key in expected if key not in actual]
        if missing:
            return f"{path} lost key(s) {show(missing)}"
        extra = [key for key in actual if key not in expected]
        if extra:
            return f"{path} gained key(s) {show(extra)}"
        for key, item in expected.items():
            found = difference(item, actual[key], f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(expected, list | tuple):
        if not isinstance(actual, list | tuple):
            return f"{path} came back as {type(actual).__name__} {show(actual)}, expected a list"
        if len(actual) != len(expected):
            return f"{path} came back with {len(actual)} item(s), expected {len(expected)}"
        for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
            found = difference(want, got, f"{path}[{index}]")
            if found:
                return found
        return None
    if type(actual) is not type(expected):
        return (
            f"{path} came back as {show(actual)} ({type(actual).__name__}), "
            f"expected {show(expected)} ({type(expected).__name__})"
        )
    if isinstance(expected, float) and math.copysign(1.0, expected) != math.copysign(1.0, actual):
        return f"{path} came back as {actual!r}, expected {expected!r}"
    if actual != expected:
        return f"{path} came back as {show(actual)}, expected {show(expected)}"
    return None


def expect_same(expected: Any, actual: Any, path: str, rule: str) -> None:
    """Raise a violation naming the first difference between ``expected`` and ``actual``."""
    found = difference(expected, actual, path)
    if found:
        raise violation(f"{found}; {rule}")


def expect_sequence(value: Any, what: str, rule: str) -> Sequence[Any]:
    """``value`` as a sequence, or a violation when a read returned something else (``None``...)."""
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return value
    raise violation(f"{what} returned {show(value)} ({type(value).__name__}); {rule}")


def rich_payload(marker: str) -> dict[str, Any]:
    """A JSON payload that catches lossy storage: unicode, NUL, float/int types, nulls, empties."""
    return {
        "marker": marker,
        "unicode": "héllo wörld — 你好 🐧 \u2028 end",
        "nul": "before\x00after",
        "escapes": 'quote " backslash \\ tab \t newline \n',
        "int": 42,
        "big_int": 2**53 + 1,
        "negative": -7,
        "float": 0.1,
        "whole_float": 3.0,
        "tiny": 1e-300,
        "huge": 1.5e300,
        "true": True,
        "false": False,
        "null": None,
        "empty_dict": {},
        "empty_list": [],
        "empty_string": "",
        "": "empty key",
        "nested": {"list": [1, 2.5, "three", None, {"deep": [[], {}]}], "ünïcode_kéy": "ok"},
    }
