"""``guarded check MODULE:CALLABLE``: run the contract suite against a store built by a factory.

The factory follows PenguiFlow's admin CLI convention (spec 000 "Admin CLI", "Factory
Specification"): ``module.path:callable``, sync or async, returning a StateStore. The command
prints the store's capability report, then the contract results, closes the store (``aclose()``
or ``close()``, awaited when they return an awaitable) and exits 0 when every offered contract
passed, 1 when any failed or errored, 2 for usage and import errors.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .protocol import CapabilityReport, capabilities
from .testing.contract import DEFAULT_TIMEOUT, ContractReport, run_contracts, select_contracts

if TYPE_CHECKING:
    from .cli import Subparsers


class UsageError(Exception):
    """The factory spec, its import or its call failed: exit status 2."""


def register(subparsers: Subparsers) -> None:
    """Add the ``check`` subcommand."""
    parser = subparsers.add_parser(
        "check",
        help="run the StateStore contract suite against a store",
        description=(
            "Run the StateStore contract suite against the store a factory returns. The factory follows "
            "PenguiFlow's admin CLI convention, module.path:callable, sync or async. Prints the capability "
            "report and the results, closes the store (aclose() or close()) and exits 0 when every offered "
            "contract passed, 1 when any failed, 2 for usage or import errors."
        ),
    )
    parser.add_argument(
        "factory",
        metavar="MODULE:CALLABLE",
        help="factory returning the store (sync or async), e.g. myapp.stores:create_store",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only this contract or capability (repeatable), e.g. planner_state or tasks.upsert",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"time limit per contract (default {DEFAULT_TIMEOUT:g})",
    )
    parser.add_argument(
        "--app-dir",
        default=".",
        metavar="DIR",
        help="directory put first on sys.path before importing the factory (default: the current one)",
    )
    parser.set_defaults(handler=run)


def load_factory(spec: str) -> Any:
    """The callable named by ``module.path:attribute`` (the attribute may be dotted)."""
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name.strip() or not attribute.strip():
        raise UsageError(
            f"invalid factory {spec!r}: expected 'module.path:callable', e.g. 'myapp.stores:create_store'"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UsageError(f"cannot import {module_name!r}: no module named {exc.name!r}") from exc
        raise UsageError(f"importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise UsageError(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise UsageError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not callable(target):
        raise UsageError(f"{spec!r} is a {type(target).__name__}, not a callable returning a store")
    return target


async def build_store(factory: Any, spec: str) -> Any:
    """Call the factory and await its result when it is awaitable."""
    try:
        store = factory()
        if inspect.isawaitable(store):
            store = await store
    except Exception as exc:
        raise UsageError(f"calling {spec!r} failed: {type(exc).__name__}: {exc}") from exc
    return store


async def close_store(store: Any) -> None:
    """``aclose()`` or else ``close()``, awaited when it returns an awaitable; failures are reported."""
    for name in ("aclose", "close"):
        method = getattr(store, name, None)
        if callable(method):
            try:
                result = method()
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                print(
                    f"guarded check: warning: {name}() failed: {type(exc).__name__}: {exc}", file=sys.stderr
                )
            return


def render_json(report: CapabilityReport, results: ContractReport) -> str:
    """The capability report and the contract results as one JSON document."""
    document = {
        **results.to_dict(),
        "capabilities": {
            status.capability.name: {"offered": status.offered, "missing": list(status.missing)}
            for status in report.statuses
        },
        "legacy_aliases": list(report.legacy_aliases),
        "artifact_store": report.artifact_store_type,
    }
    return json.dumps(document, indent=2, ensure_ascii=False)


async def check(spec: str, *, only: Sequence[str] | None, per_contract_timeout: float, as_json: bool) -> int:
    """Build the store, report its capabilities, run the contracts, close it; return the exit status."""
    factory = load_factory(spec)
    store = await build_store(factory, spec)
    try:
        report = capabilities(store)
        results = await run_contracts(store, only=only, per_contract_timeout=per_contract_timeout)
    finally:
        await close_store(store)
    if as_json:
        print(render_json(report, results))
    else:
        print(report)
        print()
        print(results)
    return 0 if results.ok else 1


def run(args: argparse.Namespace) -> int:
    """Handler of ``guarded check``."""
    try:
        select_contracts(args.only)
    except ValueError as exc:
        print(f"guarded check: error: {exc}", file=sys.stderr)
        return 2
    if args.timeout <= 0:
        print("guarded check: error: --timeout must be positive", file=sys.stderr)
        return 2
    sys.path.insert(0, os.path.abspath(args.app_dir))
    try:
        return asyncio.run(
            check(args.factory, only=args.only, per_contract_timeout=args.timeout, as_json=args.json)
        )
    except UsageError as exc:
        print(f"guarded check: error: {exc}", file=sys.stderr)
        return 2
