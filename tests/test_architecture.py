"""The architecture's rules that a reader could only check by reading every module: the core
imports no backend, a backend imports no other, no import cycle, and a call's outcome has one
writer."""

from __future__ import annotations

import ast
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
    assert "backends.postgres.migrations" in _import_graph()["backends.postgres.lifecycle"]


def test_no_new_import_cycle() -> None:
    """No group of modules imports each other, however hidden the import (inside a function, under
    ``TYPE_CHECKING``), beyond the groups :data:`CYCLES_LEFT` still lists."""
    grown = [
        sorted(group) for group in _cycles(_import_graph()) if not any(group <= left for left in CYCLES_LEFT)
    ]
    assert grown == []
