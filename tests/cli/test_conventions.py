"""One convention for every ``guarded`` command (docs/cli.md): the error cases users met, each
as the one line and the exit code an operator gets, without a database."""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from guarded.cli import build_parser
from guarded.cli.support import (
    EXIT_CODES,
    EXIT_NOT_MIGRATED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    format_duration,
    parse_duration,
)

from .support import REPO, clean_environment, closed_port, guarded, in_process

DOCS = REPO / "docs" / "cli.md"


def parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[str, argparse.ArgumentParser]]:
    """Every parser under ``parser`` with its command path."""
    found = [(" ".join(path), parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += parsers(sub, (*path, name))
    return found


def test_every_command_and_subcommand_has_a_description() -> None:
    found = parsers(build_parser())
    assert {"pg migrate", "pg status", "pg cleanup", "dlq replay", "check", "demo"} <= {
        name for name, _ in found
    }
    missing = [name or "guarded" for name, parser in found if not (parser.description or "").strip()]
    assert missing == []


def test_pg_help_describes_each_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    for command, words in (
        ("migrate", "advisory lock"),
        ("status", "4 when migrations are pending"),
        ("cleanup", "30s, 15m, 12h, 30d"),
    ):
        ran = in_process(capsys, "pg", command, "--help")
        assert ran.code == 0
        assert words in " ".join(ran.out.split())


def test_the_exit_codes_are_one_table_in_the_docs_linked_from_the_readme() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for code, _ in EXIT_CODES:
        assert re.search(rf"^\| `{code}` \|", text, re.MULTILINE), f"exit code {code} is not in docs/cli.md"
    assert "https://guarded-dev.github.io/guarded/cli/" in (REPO / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("15m", 900.0),
        ("12h", 43_200.0),
        ("30d", 2_592_000.0),
        ("2w", 1_209_600.0),
        ("1h30m", 5_400.0),
        ("500ms", 0.5),
        ("90", 90.0),
        ("1.5", 1.5),
        (" 12H ", 43_200.0),
    ],
)
def test_durations_take_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-5", "must not be negative, got '-5'"),
        ("0", "must be longer than zero, got '0'"),
        ("0s", "must be longer than zero"),
        ("abc", "'abc' is not a duration"),
        ("5x", "'5x' is not a duration"),
        ("inf", "'inf' is not a duration"),
        ("", "'' is not a duration"),
    ],
)
def test_durations_that_are_not(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_duration(text)


def test_durations_read_back() -> None:
    assert [format_duration(value) for value in (30, 900, 43_200, 2_592_000, 5_400, 1.5)] == [
        "30s",
        "15m",
        "12h",
        "30d",
        "1h30m",
        "1.5s",
    ]
    assert parse_duration("0", allow_zero=True) == 0
    assert math.isclose(parse_duration(format_duration(93_784)), 93_784)


def test_demo_refuses_a_port_out_of_range_in_one_line() -> None:
    ran = guarded("demo", "--metrics-port", "99999")
    assert ran.code == EXIT_USAGE
    assert ran.error == (
        "error: argument --metrics-port: '99999' is not a port number; "
        "hint: use 0 to 65535; 0 picks a free port"
    )
    assert "Traceback" not in ran.err


def test_cleanup_refuses_a_negative_age_in_one_line() -> None:
    ran = guarded("pg", "cleanup", "--max-age-events", "-5")
    assert ran.code == EXIT_USAGE
    assert ran.error == (
        "error: argument --max-age-events: must not be negative, got '-5'; "
        "hint: write a duration such as 30s, 15m, 12h or 30d (a plain number is seconds)"
    )


def test_an_argument_error_is_one_line_with_the_help_to_see(capsys: pytest.CaptureFixture[str]) -> None:
    ran = in_process(capsys, "pg", "cleanup", "--max-age-events")
    assert ran.code == EXIT_USAGE
    assert (
        ran.error
        == "error: argument --max-age-events: expected one argument; hint: see 'guarded pg cleanup --help'"
    )
    ran = in_process(capsys, "pg", "vacuum")
    assert ran.code == EXIT_USAGE
    assert ran.error.startswith("error: argument PG_COMMAND: invalid choice: 'vacuum'")


def test_only_names_what_exists_and_never_an_empty_guess(capsys: pytest.CaptureFixture[str]) -> None:
    ran = in_process(capsys, "check", "tests.cli.factories:memory_store", "--only", "nosuch")
    assert ran.code == EXIT_USAGE
    assert "did you mean" not in ran.error
    assert ran.error.startswith(
        "error: unknown contract or capability: 'nosuch'; hint: the capabilities are "
    )
    assert "planner_state" in ran.error
    assert "'guarded check --list' lists every contract" in ran.error
    ran = in_process(capsys, "check", "tests.cli.factories:memory_store", "--only", "planner_stat")
    assert ran.code == EXIT_USAGE
    assert "'planner_stat' (did you mean planner_state" in ran.error
    listed = in_process(capsys, "check", "--list")
    assert listed.code == 0
    assert "  planner_state.consume_once" in listed.out


def test_pg_status_without_a_dsn_names_the_default_it_tried() -> None:
    port = closed_port()
    ran = guarded("pg", "status", env=clean_environment(PGPORT=str(port)))
    assert ran.code == EXIT_UNREACHABLE
    line = ran.error
    assert line.startswith(f"error: cannot connect to PostgreSQL at postgresql://localhost:{port}/")
    assert "(the default: none of --dsn, GUARDED_PG_DSN, DATABASE_URL or PGHOST is set; " in line
    assert "the Unix sockets in /run/postgresql, /var/run/postgresql and /tmp)" in line
    assert "ConnectionRefusedError" in line or "OSError" in line
    assert line.endswith("hint: pass --dsn or set GUARDED_PG_DSN (or DATABASE_URL, or PGHOST and friends)")


@pytest.mark.parametrize(
    "argv",
    [
        ("pg", "status"),
        ("pg", "migrate"),
        ("pg", "migrate", "--sql"),
        ("pg", "cleanup", "--max-age-events", "30d"),
    ],
)
def test_an_unreachable_database_exits_3_from_pg(argv: tuple[str, ...]) -> None:
    port = closed_port()
    ran = guarded(*argv, "--dsn", f"postgresql://app@127.0.0.1:{port}/app")
    assert ran.code == EXIT_UNREACHABLE
    assert ran.error.startswith(
        f"error: cannot connect to PostgreSQL at postgresql://127.0.0.1:{port}/app?schema=public "
        "(from --dsn): "
    )
    assert ran.error.endswith("hint: check that the server is up and the host and port are right")


def test_the_dsn_source_is_named(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    port = closed_port()
    monkeypatch.setenv("GUARDED_PG_DSN", f"postgresql://app:secret@127.0.0.1:{port}/app")
    monkeypatch.setenv("GUARDED_PG_SCHEMA", "tenant_a")
    ran = in_process(capsys, "pg", "status")
    assert ran.code == EXIT_UNREACHABLE
    assert f"at postgresql://127.0.0.1:{port}/app?schema=tenant_a (from GUARDED_PG_DSN)" in ran.error
    assert "secret" not in ran.error
    monkeypatch.delenv("GUARDED_PG_DSN")
    monkeypatch.setenv("DATABASE_URL", f"postgresql://app@127.0.0.1:{port}/other")
    ran = in_process(capsys, "pg", "status")
    assert f"at postgresql://127.0.0.1:{port}/other?schema=tenant_a (from DATABASE_URL)" in ran.error


def test_a_bad_connection_string_or_schema_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    ran = in_process(capsys, "pg", "status", "--dsn", "mysql://x@127.0.0.1/x")
    assert ran.code == EXIT_USAGE
    assert ran.error.startswith("error: invalid connection string (from --dsn): ")
    assert ran.error.endswith("hint: write it as postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE")
    ran = in_process(capsys, "pg", "status", "--schema", "Not-Valid", "--dsn", "postgresql://x@127.0.0.1:1/x")
    assert ran.code == EXIT_USAGE
    assert ran.error.startswith("error: --schema: invalid schema name 'Not-Valid'")


def test_migrate_from_without_sql_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    ran = in_process(capsys, "pg", "migrate", "--from", "1", "--dsn", "postgresql://x@127.0.0.1:1/x")
    assert ran.code == EXIT_USAGE
    assert ran.error == "error: --from goes with --sql; hint: add --sql to print the SQL from that version on"


def test_migrate_sql_from_a_version_needs_no_database(capsys: pytest.CaptureFixture[str]) -> None:
    port = closed_port()
    ran = in_process(
        capsys,
        "pg",
        "migrate",
        "--sql",
        "--from",
        "2",
        "--schema",
        "tenant_a",
        "--dsn",
        f"postgresql://x@127.0.0.1:{port}/x",
    )
    assert ran.code == 0, ran.err
    assert ran.err == ""
    assert "-- pending: 0003_session_traces, 0004_snapshots" in ran.out
    assert "0001_initial" not in ran.out
    assert 'SET LOCAL search_path TO "tenant_a", pg_catalog;' in ran.out
    assert ran.out.rstrip().endswith(";")


def test_a_file_that_is_not_a_spill_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ran = in_process(capsys, "dlq", "stats", "--path", str(tmp_path / "missing.sqlite"))
    assert ran.code == EXIT_USAGE
    assert ran.error.startswith(
        f"error: no dead-letter spill file at '{tmp_path / 'missing.sqlite'}'; hint: "
    )


def test_not_migrated_has_its_own_exit_code() -> None:
    assert EXIT_NOT_MIGRATED not in (0, 1, EXIT_USAGE, EXIT_UNREACHABLE)
    assert len({code for code, _ in EXIT_CODES}) == len(EXIT_CODES)


def test_promtool_cases_help_prints_usage_and_writes_nothing(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "tests.alerts.promtool_cases", "--help"],
        cwd=tmp_path,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("usage: python -m tests.alerts.promtool_cases")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("factory", "code"),
    [("tests.no_such_module:make", EXIT_USAGE), ("tests.cli.factories:memory_store", 0)],
)
def test_check_leaves_no_temporary_directory_behind(
    factory: str,
    code: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert in_process(capsys, "check", factory, "--only", "core").code == code
    assert list(tmp_path.iterdir()) == []
