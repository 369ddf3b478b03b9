"""The architecture's rules that a reader could only check by reading every module (issue 15):
the core imports no backend, a backend imports no other, and a call's outcome has one writer."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "guarded"
BACKENDS = ROOT / "backends"

APPLICATIONS = ("cli", "demo", "testing", "backends")
"""Parts of ``guarded/`` that use a backend on purpose: the command line (``guarded check`` of a
PostgreSQL store), the PostgreSQL demo, the test support, and the backends' own import path."""

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
