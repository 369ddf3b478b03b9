"""The architecture's rules that a reader could only check by reading every module: the core
imports no backend, a backend imports no other, no import cycle, no two folders of the core
import each other, and a call's outcome has one writer."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "guarded"
BACKENDS = ROOT / "backends"

APPLICATIONS = ("demo", "testing", "backends")
"""Parts of ``guarded/`` that use a backend on purpose: the PostgreSQL demo, the test support, and
the backends' own import path. The command line is not one of them: it finds the backends' command
lines by name or entry point (``guarded.cli.plugin``), so a backend's command imports the command
line's plugin interface and the command line imports no backend."""

BACKEND_MODULES = ("asyncpg", "guarded.backends", "backends")


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


_TREES = {path: _parse(path) for root in (CORE, BACKENDS) for path in root.rglob("*.py")}
"""Parsed when the module is collected, before any test runs: CPython 3.11's AST conversion keeps
its recursion depth in state shared by all threads, so parsing while a thread left by an earlier
test compiles code can fail with ``SystemError: AST constructor recursion depth mismatch``."""


def _modules(root: Path, *, skip: tuple[str, ...] = ()) -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if relative.parts[0] in skip or "__pycache__" in relative.parts:
            continue
        yield path, _TREES.get(path) or _parse(path)


def _imported(path: Path, root: Path, tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Every module ``tree`` imports (relative imports resolved against ``root``'s package)."""
    package = [root.name, *path.relative_to(root).parent.parts]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            yield node.lineno, base


def _is_under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def test_the_core_imports_no_backend() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path, tree in _modules(CORE, skip=APPLICATIONS)
        for line, module in _imported(path, CORE, tree)
        if _is_under(module, BACKEND_MODULES)
    ]
    assert found == []


@pytest.mark.parametrize(
    ("backend", "foreign"),
    [
        ("postgres", ("guarded.backends.memory", "backends.memory")),
        ("memory", ("asyncpg", "guarded.backends.postgres", "backends.postgres")),
    ],
)
def test_a_backend_imports_no_other_backend(backend: str, foreign: tuple[str, ...]) -> None:
    paths = [BACKENDS / backend] if (BACKENDS / backend).is_dir() else sorted(BACKENDS.glob(f"{backend}*.py"))
    assert paths, f"no module of the {backend} backend under {BACKENDS}"
    found = []
    for start in paths:
        trees = _modules(start) if start.is_dir() else [(start, _TREES.get(start) or _parse(start))]
        for path, tree in trees:
            for line, module in _imported(path, BACKENDS, tree):
                if _is_under(module, foreign):
                    found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert found == []


BACKEND_MAY_IMPORT = (
    "guarded",
    "guarded.backend",
    "guarded.backends",
    "guarded.cli.plugin",
    "guarded.codec",
    "guarded.errors",
    "guarded.models",
    "guarded.snapshots",
)
"""What a backend may import of the library: the public package, the backend interface (with its
metric names and per-registry helper), its own package, the command-line plugin interface (a
backend's ``guarded <backend>`` command), the records it stores and their codecs, the errors, and
(a backend offering snapshots) the snapshot-store interface ``guarded.snapshots`` exports.
Relative imports within a backend are its own."""


def _backend_imports_of_the_library() -> set[tuple[str, str]]:
    found = set()
    for path, tree in _modules(BACKENDS):
        for _, module in _imported(path, BACKENDS, tree):
            if module == "guarded" or module.startswith("guarded."):
                found.add((str(path.relative_to(ROOT)), module))
    return found


def test_backends_import_only_the_public_api_and_the_backend_interface() -> None:
    outside = sorted(
        f"{path} imports {module}"
        for path, module in _backend_imports_of_the_library()
        if module not in BACKEND_MAY_IMPORT and not module.startswith("guarded.backends.")
    )
    assert outside == [], "a backend imports the library's internals"


def test_a_call_is_settled_only_by_call_settle() -> None:
    """``Call.outcome`` and ``Call.error`` have one writer, ``Call.settle``: a layer that answers
    a call settles it there, so what the metrics layer reads is written in one place."""
    writers = []
    for path, tree in _modules(CORE):
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                for element in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if (
                        isinstance(element, ast.Attribute)
                        and element.attr in {"outcome", "error"}
                        and isinstance(element.value, ast.Name)
                        and element.value.id == "call"
                    ):
                        writers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert writers == []


CYCLES_LEFT: tuple[frozenset[str], ...] = ()
"""The import cycles still to undo (each a group of modules that import each other); none may
grow and no other may appear."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Which of our modules each of our modules imports, counting imports inside functions and
    under ``TYPE_CHECKING`` (``guarded.backends`` is ``backends``; a package is its ``__init__``)."""
    paths = {
        _module_name(path): path
        for root in (CORE, BACKENDS)
        for path, _ in _modules(root, skip=("backends",))
    }

    def ours(name: str) -> str | None:
        if name.startswith("guarded.backends"):
            name = "backends" + name.removeprefix("guarded.backends")
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        imported: set[str] = set()
        for node in ast.walk(_TREES.get(path) or _parse(path)):
            if isinstance(node, ast.Import):
                imported.update(filter(None, (ours(alias.name) for alias in node.names)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package[: len(package) - node.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                for alias in node.names:  # "from package import module" imports the module
                    found = ours(f"{base}.{alias.name}")
                    imported.update(filter(None, [found if found != base else ours(base)]))
        graph[name] = imported - {name}
    return graph


def _cycles(graph: Mapping[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[frozenset[str]] = []
    for start in graph:
        if start in order:
            continue
        work = [(start, iter(sorted(graph[start])))]
        order[start] = low[start] = len(order)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in order:
                    order[successor] = low[successor] = len(order)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], order[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == order[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(frozenset(group))
    return groups


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"} - {"e"}}
    assert _cycles(graph) == [frozenset({"a", "b", "c"})]
    assert "backends.postgres.schema_migrations" in _import_graph()["backends.postgres.lifecycle"]


def test_no_new_import_cycle() -> None:
    """No group of modules imports each other, however hidden the import (inside a function, under
    ``TYPE_CHECKING``), beyond the groups :data:`CYCLES_LEFT` still lists."""
    grown = [
        sorted(group) for group in _cycles(_import_graph()) if not any(group <= left for left in CYCLES_LEFT)
    ]
    assert grown == []


def test_the_library_runs_no_source_text() -> None:
    """Every layer's logic exists once, as code linters, type checkers and coverage see: nothing
    in the library compiles or executes source text."""
    found = []
    for root in ("guarded", "backends"):
        for path in sorted((ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in {"exec", "eval", "compile"}
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.id}()")
    assert found == []


NAMES_LEFT_TO_MAKE_UNIQUE: frozenset[str] = frozenset()
"""Module names still used in more than one folder: ``layers/`` and ``pipeline/`` or
``durability/`` each hold a module of that name. The set may only shrink (a name no longer repeated
fails the test too, so it is removed when fixed)."""


def test_module_names_are_unique_across_folders() -> None:
    """A module's name says what it holds wherever it is read (a traceback, a log record's
    ``module``, a search): no two modules of ``guarded/`` and ``backends/`` share one."""
    folders: dict[str, list[str]] = {}
    for root in (CORE, BACKENDS):
        for path, _ in _modules(root, skip=("backends",)):
            if path.name not in {"__init__.py", "__main__.py"}:
                folders.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    repeated = {name: paths for name, paths in folders.items() if len(paths) > 1}
    assert {name: paths for name, paths in repeated.items() if name not in NAMES_LEFT_TO_MAKE_UNIQUE} == {}
    assert sorted(NAMES_LEFT_TO_MAKE_UNIQUE - set(repeated)) == [], (
        "no longer repeated: remove from NAMES_LEFT_TO_MAKE_UNIQUE"
    )


def test_the_package_exports_a_small_public_face() -> None:
    """``guarded`` exports what an application uses; extension points, task-telemetry sinks and
    OTLP export have modules of their own, and a name that moved says where it went."""
    import guarded

    assert len(guarded.__all__) <= 25
    assert [name for name in guarded.__all__ if not hasattr(guarded, name)] == []
    for name, home in guarded._MOVED.items():
        assert hasattr(importlib.import_module(home), name), f"{home} has no {name}"
        with pytest.raises(ImportError, match=rf"^guarded\.{name} has moved: from {home} import {name}$"):
            getattr(guarded, name)
    unknown = "no_such_name"
    assert not hasattr(guarded, unknown)


ROOMS_LEFT: frozenset[frozenset[str]] = frozenset()
"""Pairs of rooms of ``guarded/`` that still import each other (see
:func:`test_no_two_rooms_of_the_core_import_each_other`): this set may only shrink (a pair that no
longer imports each other fails the test too, so it is removed when fixed)."""


def _room(module: str) -> str | None:
    """The room of ``guarded/`` holding ``module``: its subpackage or its top-level module
    (``guarded.durability.owner`` → ``guarded.durability``); ``None`` outside ``guarded/``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "guarded" and len(parts) > 1 else None


def _rooms_importing_each_other(graph: Mapping[str, set[str]]) -> dict[frozenset[str], list[str]]:
    """Every pair of rooms each of which imports the other, with the imports that make it."""
    between: dict[tuple[str, str], list[str]] = {}
    for module, imported in graph.items():
        room = _room(module)
        for target in imported:
            other = _room(target)
            if room is not None and other is not None and room != other:
                between.setdefault((room, other), []).append(f"{module} -> {target}")
    return {
        frozenset(pair): sorted(found + between[pair[::-1]])
        for pair, found in between.items()
        if pair[::-1] in between
    }


def test_the_room_finder_finds_two_folders_importing_each_other() -> None:
    graph = {
        "guarded": {"guarded.c"},
        "guarded.a.x": {"guarded.b"},
        "guarded.a.y": {"guarded.a.x"},
        "guarded.b": {"guarded.a.y"},
        "guarded.c": {"guarded.a.x", "guarded.b"},
    }
    assert _rooms_importing_each_other(graph) == {
        frozenset({"guarded.a", "guarded.b"}): ["guarded.a.x -> guarded.b", "guarded.b -> guarded.a.y"]
    }


def test_no_two_rooms_of_the_core_import_each_other() -> None:
    """Each subpackage and top-level module of ``guarded/`` (a room) sits above or below each other
    one, never both: a room imports another only when that one imports nothing of it, however
    hidden the import (inside a function, under ``TYPE_CHECKING``). A lower room that needs
    something of a higher one receives it when it is built, typed by a protocol of its own."""
    pairs = _rooms_importing_each_other(_import_graph())
    assert {pair: found for pair, found in pairs.items() if pair not in ROOMS_LEFT} == {}
    assert sorted(sorted(pair) for pair in ROOMS_LEFT - pairs.keys()) == [], (
        "no longer importing each other: remove from ROOMS_LEFT"
    )
