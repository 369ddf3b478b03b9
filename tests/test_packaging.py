"""The wheel ships every package of the source tree, and the editable install maps guarded.backends.

``backends/`` lives at the top of the repository but installs as ``guarded.backends``, and
``pyproject.toml`` lists every package explicitly: a package left out of that list is missing
from the wheel, which these tests catch by importing every module of the source tree from a
freshly built wheel in a scratch virtualenv.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = {"guarded": REPO / "guarded", "guarded.backends": REPO / "backends"}
"""Import name of each source folder (mirrors ``[tool.setuptools] package-dir``)."""

_IGNORED = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    "*.pyc",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
)

IMPORT_ALL = """
import importlib, json, sys
results = {}
for name in json.loads(sys.argv[2]):
    try:
        module = importlib.import_module(name)
    except BaseException as exc:
        results[name] = {"error": f"{type(exc).__name__}: {exc}"}
    else:
        results[name] = {"file": getattr(module, "__file__", None)}
with open(sys.argv[1], "w") as out:
    json.dump(results, out)
"""


def _walk(root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*") if path.is_file() and "__pycache__" not in path.parts)


def source_modules() -> list[str]:
    """Every module and package under the source roots, by import name."""
    names: set[str] = set()
    for package, root in SOURCE_ROOTS.items():
        for path in _walk(root):
            if path.suffix != ".py":
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.add(".".join([package, *parts]))
    return sorted(names)


def source_files_in_wheel_layout() -> dict[str, Path]:
    """Where each source file (code and data, e.g. ``py.typed``) must appear inside the wheel."""
    expected: dict[str, Path] = {}
    for package, root in SOURCE_ROOTS.items():
        for path in _walk(root):
            if path.suffix == ".pyc":
                continue
            inside = "/".join([*package.split("."), *path.relative_to(root).parts])
            expected[inside] = path
    return expected


def run(command: Sequence[str | os.PathLike[str]], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run ``command``; on failure, fail the test with its output."""
    result: subprocess.CompletedProcess[str] = subprocess.run(
        command, capture_output=True, text=True, check=False, **kwargs
    )
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, command))} exited {result.returncode}\n"
            f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}",
            pytrace=False,
        )
    return result


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    python: Path
    workdir: Path


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Build the wheel from a clean copy of the tree and install it into a scratch virtualenv.

    The copy keeps a stale ``build/`` folder of the working tree out of the wheel; the scratch
    virtualenv has no pip (the dev environment's pip installs into it with ``--python``).
    """
    work = tmp_path_factory.mktemp("packaging")
    source = work / "source"
    shutil.copytree(REPO, source, ignore=_IGNORED, symlinks=True)
    wheels = work / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", wheels, source])
    (wheel,) = wheels.glob("guarded-*.whl")

    venv = work / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    run([*pip, "--python", python, "install", "--no-deps", "--no-index", "--quiet", wheel])
    return Installed(wheel=wheel, venv=venv, python=python, workdir=work)


def import_in_scratch_venv(installed: Installed, modules: Sequence[str]) -> dict[str, dict[str, str]]:
    """Import ``modules`` with the scratch interpreter; third-party packages come from the dev venv.

    ``PYTHONPATH`` holds the dev venv's site-packages so pydantic and friends resolve without a
    network; ``.pth`` files are not processed from ``PYTHONPATH``, so the dev venv's editable
    install of guarded stays inactive. ``-P`` and a working directory outside the repository keep
    the source tree itself off ``sys.path``.
    """
    site_dirs = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join(site_dirs)
    env["PYTHONNOUSERSITE"] = "1"
    out = installed.workdir / "imports.json"
    run(
        [installed.python, "-P", "-c", IMPORT_ALL, out, json.dumps(list(modules))],
        cwd=installed.workdir,
        env=env,
    )
    results: dict[str, dict[str, str]] = json.loads(out.read_text())
    return results


def test_source_tree_is_walked() -> None:
    modules = source_modules()
    assert "guarded" in modules
    assert "guarded.codec.records" in modules
    assert "guarded.backends" in modules


def test_every_module_imports_from_the_wheel(installed: Installed) -> None:
    modules = source_modules()
    results = import_in_scratch_venv(installed, modules)
    venv = installed.venv.resolve()

    assert "error" not in results["guarded"], f"import guarded failed: {results['guarded']['error']}"
    guarded_file = Path(results["guarded"]["file"]).resolve()
    assert guarded_file.is_relative_to(venv), f"guarded was imported from {guarded_file}, not the wheel"

    problems = []
    for name in modules:
        result = results[name]
        if "error" in result:
            problems.append(f"{name}: {result['error']}")
        elif not Path(result["file"]).resolve().is_relative_to(venv):
            problems.append(f"{name}: imported from {result['file']}, not from the installed wheel")
    assert not problems, (
        "modules of the source tree that do not import from the wheel "
        "(a package missing from [tool.setuptools] packages in pyproject.toml?):\n  " + "\n  ".join(problems)
    )


def test_backends_install_as_guarded_backends(installed: Installed) -> None:
    """``guarded.backends.memory`` (the reference store) comes from the wheel, not the repository."""
    name = "guarded.backends.memory" if (REPO / "backends" / "memory.py").exists() else "guarded.backends"
    result = import_in_scratch_venv(installed, [name, "guarded.backends"])
    for module in (name, "guarded.backends"):
        assert "error" not in result[module], result[module]
        path = Path(result[module]["file"]).resolve()
        assert path.is_relative_to(installed.venv.resolve() / "lib"), path
        assert path.parent.name == "backends"
        assert path.parent.parent.name == "guarded"


def test_wheel_contents(installed: Installed) -> None:
    """Every source file (code and data) is in the wheel under its import path, and nothing else is."""
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        entry_points_name = next((n for n in names if n.endswith(".dist-info/entry_points.txt")), None)
        entry_points = wheel.read(entry_points_name).decode() if entry_points_name else ""

    top_level = {name.split("/", 1)[0] for name in names}
    dist_info = {name for name in top_level if name.endswith(".dist-info")}
    assert top_level - dist_info == {"guarded"}, f"unexpected top-level entries: {sorted(top_level)}"

    missing = sorted(set(source_files_in_wheel_layout()) - names)
    assert not missing, f"source files missing from the wheel: {missing}"
    assert "guarded/py.typed" in names

    # Every console script points at a module the wheel contains.
    parser = configparser.ConfigParser()
    parser.read_string(entry_points)
    scripts = dict(parser["console_scripts"]) if parser.has_section("console_scripts") else {}
    assert "guarded" in scripts
    for script, target in scripts.items():
        module = target.split(":", 1)[0].strip()
        path = module.replace(".", "/")
        assert f"{path}.py" in names or f"{path}/__init__.py" in names, (
            f"script {script!r}: {module} not in wheel"
        )


def test_editable_install_maps_backends_to_the_repository(tmp_path: Path) -> None:
    """In the dev environment, ``guarded`` and ``guarded.backends`` resolve to the repository's folders.

    Run in a fresh interpreter outside the repository so only the editable install can find them.
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    script = (
        "import json, guarded, guarded.backends\n"
        "print(json.dumps([guarded.__file__, guarded.backends.__file__]))"
    )
    result = run([sys.executable, "-P", "-c", script], cwd=tmp_path, env=env)
    guarded_file, backends_file = (
        Path(path).resolve() for path in json.loads(result.stdout.strip().splitlines()[-1])
    )
    assert guarded_file == (REPO / "guarded" / "__init__.py").resolve()
    assert backends_file == (REPO / "backends" / "__init__.py").resolve()
