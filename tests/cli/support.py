"""Helpers of the command-line tests: run ``guarded`` as a user would, read what it printed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from guarded.cli import main

REPO = Path(__file__).resolve().parents[2]
CONNECTION_VARIABLES = ("DATABASE_URL", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGPASSWORD", "PGSERVICE")


@dataclass(frozen=True)
class Ran:
    code: int | None
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]

    @property
    def error(self) -> str:
        """The one line a failed command prints on stderr (and the test fails unless it is one)."""
        return self.error_after("")

    def error_after(self, progress: str) -> str:
        """The one ``error:`` line on stderr besides the progress lines starting with ``progress``."""
        lines = [line for line in self.err_lines if not (progress and line.startswith(progress))]
        assert len(lines) == 1, f"expected one line on stderr, got {lines!r}"
        assert lines[0].startswith("error: "), lines[0]
        return lines[0]


def clean_environment(**extra: str) -> dict[str, str]:
    """The test's environment without any connection setting or ``GUARDED_*`` variable, plus ``extra``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("GUARDED_") and name not in CONNECTION_VARIABLES
    }
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def guarded(*argv: str, env: dict[str, str] | None = None, timeout: float = 120) -> Ran:
    """``python -m guarded ARGV`` in a subprocess, from the repository, in a clean environment."""
    completed = subprocess.run(
        [sys.executable, "-m", "guarded", *argv],
        cwd=REPO,
        env=env if env is not None else clean_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Ran(completed.returncode, completed.stdout, completed.stderr)


def in_process(capsys: pytest.CaptureFixture[str], *argv: str) -> Ran:
    """``guarded ARGV`` through :func:`guarded.cli.main` in this process."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return Ran(code, captured.out, captured.err)


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


__all__ = ["REPO", "Ran", "clean_environment", "closed_port", "guarded", "in_process"]
