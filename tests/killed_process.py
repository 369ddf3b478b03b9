"""Run a test module as a script, read the JSON report it prints once its writes are acknowledged,
then SIGKILL it: how the crash tests stand in for a process killed mid-work."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def report_then_kill(module: str, arguments: Sequence[str], log_path: Path, *, timeout: float) -> Any:
    """``python -m module *arguments``: its first stdout line (JSON), after which it is SIGKILLed.

    Its stderr goes to ``log_path`` (a file, not a pipe: the process never blocks on it); a
    process that prints nothing within ``timeout`` seconds is killed and the test fails with its log.
    """
    with (
        log_path.open("w") as log,
        subprocess.Popen(
            [sys.executable, "-m", module, *arguments],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        ) as process,
    ):
        assert process.stdout is not None
        watchdog = threading.Timer(timeout, process.kill)  # a hung process must not hang the test
        watchdog.start()
        try:
            line = process.stdout.readline()
        finally:
            watchdog.cancel()
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
    assert line, f"the process printed nothing:\n{log_path.read_text()}"
    assert process.returncode == -signal.SIGKILL
    return json.loads(line)
