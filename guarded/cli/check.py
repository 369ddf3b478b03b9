"""``guarded check MODULE:CALLABLE``: run the contract suite against a store built by a factory.

The factory follows PenguiFlow's admin CLI convention (spec 000 "Admin CLI", "Factory
Specification"): ``module.path:callable``, sync or async, returning a StateStore. The command
prints where it ran and the store's capability report, then the contract results, closes the
store (``aclose()`` or ``close()``, awaited when they return an awaitable) and exits 0 when every
offered contract passed, 1 when any failed or errored, 2 for usage and import errors, 3 when the
store's backend cannot be reached.

**It never touches user data.** The contracts write (events, bindings, tasks, ...), so the store
is built in a scratch namespace the command creates and drops:

* for the PostgreSQL backend, a schema ``guarded_check_<random>``: while the factory runs,
  ``GUARDED_PG_SCHEMA`` names it (``guarded.backends.postgres.factory`` reads it; so must a
  factory of your own), and the store must report that schema or the check refuses to run;
  the schema is dropped (``DROP SCHEMA ... CASCADE``) when the check ends, pass or fail;
* a guard's dead-letter spill file goes to a temporary directory (``GUARDED_DLQ_PATH``), so the
  check never joins or adopts the spill files of your running processes;
* the in-memory store is new for the check and kept nowhere;
* any other store is checked with a warning that guarded cannot verify where it keeps its data.

``--keep`` leaves the scratch schema and spill directory for inspection and prints how to drop them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from difflib import get_close_matches
from typing import TYPE_CHECKING, Any

from ..protocol import CapabilityReport, capabilities
from ..testing.contract import CONTRACTS, DEFAULT_TIMEOUT, ContractReport, run_contracts, select_contracts
from .plugin import BackendCommandLine, ScratchPlace, backend_command_lines, is_unreachable
from .support import (
    DOCUMENTATION_URL,
    EXIT_OK,
    EXIT_PROBLEM,
    CommandError,
    UnreachableError,
    UsageError,
    duration,
    interrupted,
    report,
    warn,
)

if TYPE_CHECKING:
    from . import Subparsers

SCRATCH_PREFIX = "guarded_check_"
"""Scratch schemas (and namespaces) are named ``guarded_check_<16 hex digits>``."""

__all__ = [
    "SCRATCH_PREFIX",
    "Scratch",
    "UsageError",
    "build_store",
    "check",
    "close_store",
    "factory_failure",
    "load_factory",
    "register",
    "run",
]


def register(subparsers: Subparsers) -> None:
    """Add the ``check`` subcommand."""
    parser = subparsers.add_parser(
        "check",
        help="run the StateStore contract suite against a store, in a scratch schema",
        description=(
            "Run the StateStore contract suite against the store a factory returns. The factory follows "
            "PenguiFlow's admin CLI convention, module.path:callable, sync or async. The check never "
            "touches your data: it runs in a scratch schema guarded_check_<random> that it creates and "
            "drops (the factory gets it as GUARDED_PG_SCHEMA) and spills dead letters to a temporary "
            "directory; --keep leaves them for inspection. Prints what it used, the capability report "
            "and the results, closes the store (aclose() or close()) and exits 0 when every offered "
            "contract passed, 1 when any failed, 2 for usage or import errors, 3 when the store's backend "
            "cannot be reached."
        ),
        epilog=f"See {DOCUMENTATION_URL}cli/ for the exit codes every guarded command shares.",
    )
    parser.add_argument(
        "factory",
        nargs="?",
        metavar="MODULE:CALLABLE",
        help="factory returning the store (sync or async), e.g. myapp.stores:create_store",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only this contract or capability (repeatable), e.g. planner_state or tasks.upsert",
    )
    parser.add_argument("--list", action="store_true", help="list the contracts and capabilities, then exit")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--timeout",
        type=duration(),
        default=DEFAULT_TIMEOUT,
        metavar="DURATION",
        help=f"time limit per contract, e.g. 30s (default {DEFAULT_TIMEOUT:g}s)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the scratch schema and spill directory after the check (they are printed)",
    )
    parser.add_argument(
        "--app-dir",
        default=".",
        metavar="DIR",
        help="directory put first on sys.path before importing the factory (default: the current one)",
    )
    parser.set_defaults(handler=run)


# --- the factory --------------------------------------------------------------------------------


def load_factory(spec: str) -> Any:
    """The callable named by ``module.path:attribute`` (the attribute may be dotted)."""
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name.strip() or not attribute.strip():
        raise UsageError(
            f"invalid factory {spec!r}: expected 'module.path:callable'",
            "e.g. 'myapp.stores:create_store' or 'guarded.backends.postgres.factory:create_store'",
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UsageError(
                f"cannot import {module_name!r}: no module named {exc.name!r}",
                "check the spelling, or point --app-dir at the directory that holds it",
            ) from exc
        raise UsageError(
            f"importing {module_name!r} failed: {exc}", "install what it needs in this environment"
        ) from exc
    except Exception as exc:
        raise UsageError(
            f"importing {module_name!r} failed: {type(exc).__name__}: {exc}", "fix the module's import error"
        ) from exc
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            names = [
                name for name in dir(module) if not name.startswith("_") and callable(getattr(module, name))
            ]
            close = get_close_matches(attribute, names, 3)
            hint = f"did you mean {', '.join(close)}?" if close else "name a callable that returns the store"
            raise UsageError(f"module {module_name!r} has no attribute {attribute!r}", hint) from None
    if not callable(target):
        raise UsageError(
            f"{spec!r} is a {type(target).__name__}, not a callable returning a store",
            "name a function (sync or async) that returns the store",
        )
    return target


def factory_failure(exc: BaseException, spec: str) -> CommandError:
    """The error for a factory that raised: exit 3 when its backend could not be reached."""
    why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if not is_unreachable(exc):
        return UsageError(f"calling {spec!r} failed: {why}", "fix the factory or its configuration")
    module = spec.partition(":")[0]
    for command_line in backend_command_lines():
        tried = command_line.factory_target(module)
        if tried is not None:
            return UnreachableError(
                f"cannot reach the store's backend at {tried.description}: calling {spec!r} failed: {why}",
                tried.hint,
                target=tried.identity,
            )
    return UnreachableError(
        f"cannot reach the store's backend: calling {spec!r} failed: {why}",
        "check that the store's backend is up and the factory's connection settings",
    )


async def build_store(factory: Any, spec: str) -> Any:
    """Call the factory and await its result when it is awaitable."""
    try:
        store = factory()
        if inspect.isawaitable(store):
            store = await store
    except Exception as exc:
        raise factory_failure(exc, spec) from exc
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
                warn(f"{name}() failed: {type(exc).__name__}: {exc}")
            return


# --- the scratch namespace ----------------------------------------------------------------------


@dataclass
class Scratch:
    """Where a check runs, and what became of it."""

    name: str
    spill_directory: str
    keep: bool
    place: ScratchPlace | None = None
    """Where the store keeps its data, as its backend says; ``None`` for a store no backend knows."""
    backend: BackendCommandLine | None = None
    """The command line of the backend that knows the store."""
    dropped: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        """``postgresql_schema``, ``in_memory``, ... or ``unverified`` (a store no backend knows)."""
        return self.place.kind if self.place is not None else "unverified"

    @property
    def target(self) -> str | None:
        """The server holding the namespace, when there is one."""
        return self.place.target if self.place is not None else None

    @classmethod
    def create(cls, *, keep: bool) -> Scratch:
        name = SCRATCH_PREFIX + uuid.uuid4().hex[:16]
        return cls(name, tempfile.mkdtemp(prefix=name + "-"), keep)

    def environment(self) -> dict[str, str]:
        """The variables the factory runs with: each backend's for its scratch namespace (the
        PostgreSQL schema, migrations on, no table sampling), and the guard's spill file in the
        scratch directory."""
        spill = os.path.join(self.spill_directory, "{name}.sqlite")
        variables: dict[str, str] = {}
        for command_line in backend_command_lines():
            variables.update(command_line.scratch_variables(self.name))
        variables["GUARDED_DLQ_PATH"] = spill
        for name in ("GUARDED_SPILL_PATH", "GUARDED_DEAD_LETTER__PATH"):
            if os.environ.get(name):
                variables[name] = spill
        return variables

    def describe(self) -> str:
        """One line: where the check ran and what became of it."""
        if self.place is None:
            where = f"namespace {self.name} (GUARDED_PG_SCHEMA)"
            fate = "not verified: guarded does not know where this store keeps its data"
        else:
            where = self.place.where
            fate = (
                "nothing was persisted"
                if self.place.drop_by_hand is None
                else f"kept for inspection (drop it with: {self.place.drop_by_hand})"
                if self.keep
                else "dropped after the check"
                if self.dropped
                else "NOT dropped (see the warning above)"
            )
        spill = f"; a guard's spill files kept in {self.spill_directory}" if self.keep else ""
        return f"scratch: {where}, {fate}{spill}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "target": self.target,
            "kept": self.keep,
            "dropped": self.dropped,
            "spill_directory": self.spill_directory,
            "problems": list(self.problems),
        }


@contextlib.contextmanager
def _environment(variables: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _unwrapped(store: Any) -> Any:
    from ..guard import GuardedStore, controller

    return controller(store).store if isinstance(store, GuardedStore) else store


def _isolate(store: Any, scratch: Scratch, spec: str) -> None:
    """Record where ``store`` keeps its data, as its backend says; its backend refuses a store
    outside the scratch namespace."""
    inner = _unwrapped(store)
    for command_line in backend_command_lines():
        place = command_line.scratch_place(inner, scratch.name, spec)
        if place is not None:
            scratch.place, scratch.backend = place, command_line
            return
    warn(
        f"guarded check cannot verify where {type(inner).__module__}.{type(inner).__qualname__} "
        "keeps its data (no backend's command line knows it); make sure the factory does "
        f"not point it at data you keep (GUARDED_PG_SCHEMA={scratch.name} was set for it)"
    )


async def _drop(store: Any, scratch: Scratch) -> None:
    """Drop the scratch namespace through the store (before the store closes it)."""
    from ..guard import GuardedStore, controller

    if scratch.backend is None or scratch.place is None:
        return
    if isinstance(store, GuardedStore):
        # Flush the guard's batches and replay what it holds first, so nothing writes into the
        # namespace after it is dropped.
        with contextlib.suppress(Exception):
            await controller(store).drain(5.0)
    try:
        await scratch.backend.drop_scratch(_unwrapped(store), scratch.name)
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        scratch.problems.append(f"dropping the scratch {scratch.place.where} failed: {why}")
        warn(
            f"could not drop the scratch {scratch.place.where}: {why}; "
            f"drop it with: {scratch.place.drop_by_hand}"
        )
        return
    scratch.dropped = True


# --- the check ----------------------------------------------------------------------------------


def render_json(report: CapabilityReport, results: ContractReport, scratch: Scratch | None = None) -> str:
    """The capability report, the contract results and the scratch namespace as one JSON document."""
    document = {
        **results.to_dict(),
        "capabilities": {
            status.capability.name: {"offered": status.offered, "missing": list(status.missing)}
            for status in report.statuses
        },
        "legacy_aliases": list(report.legacy_aliases),
        "artifact_store": report.artifact_store_type,
    }
    if scratch is not None:
        document["scratch"] = scratch.to_dict()
    return json.dumps(document, indent=2, ensure_ascii=False)


async def check(
    spec: str,
    *,
    only: Sequence[str] | None,
    per_contract_timeout: float,
    as_json: bool,
    keep: bool = False,
    scratch: Scratch | None = None,
) -> int:
    """Build the store in a scratch namespace, report its capabilities, run the contracts, drop
    the namespace (unless ``keep``), close the store; return the exit status."""
    scratch = scratch or Scratch.create(keep=keep)
    keep = scratch.keep
    try:
        factory = load_factory(spec)
        with _environment(scratch.environment()):
            store = await build_store(factory, spec)
            try:
                _isolate(store, scratch, spec)
                capability_report = capabilities(store)
                results = await run_contracts(store, only=only, per_contract_timeout=per_contract_timeout)
            finally:
                if scratch.place is not None and scratch.place.drop_by_hand is not None and not keep:
                    await _drop(store, scratch)
                await close_store(store)
    finally:
        if not keep:
            shutil.rmtree(scratch.spill_directory, ignore_errors=True)
    if as_json:
        print(render_json(capability_report, results, scratch))
    else:
        print(scratch.describe())
        print()
        print(capability_report)
        print()
        print(results)
    if scratch.problems:
        return EXIT_PROBLEM
    return EXIT_OK if results.ok else EXIT_PROBLEM


def _check_only(names: Sequence[str] | None) -> None:
    """Refuse unknown ``--only`` names with the closest ones and where to find the others."""
    if not names:
        return
    capabilities_ = sorted({item.capability for item in CONTRACTS})
    known = {item.name for item in CONTRACTS} | set(capabilities_)
    unknown = [name for name in names if name not in known]
    if not unknown:
        select_contracts(names)
        return
    described = []
    for name in unknown:
        close = get_close_matches(name, known, 3)
        described.append(f"{name!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    raise UsageError(
        f"unknown contract or capability: {'; '.join(described)}",
        f"the capabilities are {', '.join(capabilities_)}; 'guarded check --list' lists every contract",
    )


def _print_list() -> None:
    by_capability: dict[str, list[str]] = {}
    for item in CONTRACTS:
        by_capability.setdefault(item.capability, []).append(item.name)
    for capability, names in by_capability.items():
        print(f"{capability} ({len(names)})")
        for name in names:
            print(f"  {name}")


def run(args: argparse.Namespace) -> int:
    """Handler of ``guarded check``."""
    if args.list:
        _print_list()
        return EXIT_OK
    try:
        if not args.factory:
            raise UsageError(
                "the following arguments are required: MODULE:CALLABLE", "see 'guarded check --help'"
            )
        _check_only(args.only)
    except CommandError as exc:
        return report(exc)
    sys.path.insert(0, os.path.abspath(args.app_dir))
    scratch = Scratch.create(keep=args.keep)
    try:
        return asyncio.run(
            check(
                args.factory,
                only=args.only,
                per_contract_timeout=args.timeout,
                as_json=args.json,
                scratch=scratch,
            )
        )
    except CommandError as exc:
        return report(exc)
    except KeyboardInterrupt:
        if scratch.place is not None and scratch.place.drop_by_hand is not None:
            fate = "kept" if scratch.keep else "dropped" if scratch.dropped else "NOT dropped"
            done = f"the scratch {scratch.place.where} was {fate}"
        else:
            done = "no results were printed"
        return report(interrupted(f"the check stopped before it finished; {done}"))
