"""The SQLSTATE table — retry now, hold and replay, or park.

Errors are asyncpg's real exception classes, built the way asyncpg builds them from a server's
error message (``PostgresError.new(fields)``), so the class, its ``sqlstate`` and its message
are exactly what a live server produces. The same table is documented in docs/durability.md
("What a failure means"); a test below keeps the two in step.
"""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg
import pytest
from asyncpg import exceptions as pg

from guarded.backends.postgres.error_classifier import (
    NOT_SENT_SQLSTATES,
    SQLSTATE_CLASS_HANDLING,
    SQLSTATE_HANDLING,
    sqlstate_handling,
)
from guarded.error_classes import (
    OPERATIONAL_CONDITIONS,
    ErrorClass,
    classify,
    operational_condition,
    reached_backend,
    safe_message,
)
from guarded.errors import InvalidPayloadError
from guarded.observability import telemetry_names as names

RETRY, HOLD, PARK, FATAL = ErrorClass.RETRYABLE, ErrorClass.OPERATIONAL, ErrorClass.REJECTED, ErrorClass.FATAL

SECRET = "ssn=078-05-1120"


def server_error(code: str) -> asyncpg.PostgresError:
    """The exception asyncpg raises for a server error with SQLSTATE ``code`` (its message and
    detail quote a row, as PostgreSQL's do)."""
    error = pg.PostgresError.new(
        {
            "S": "ERROR",
            "V": "ERROR",
            "C": code,
            "M": f"something about the row ({SECRET})",
            "D": f"Failing row contains (1, {SECRET}).",
        }
    )
    assert isinstance(error, pg.PostgresError)
    return error


# (SQLSTATE, asyncpg class, handling, operational condition)
TABLE: list[tuple[str, type[asyncpg.PostgresError], ErrorClass, str | None]] = [
    # operational, held and replayed: the data is fine, the database cannot take it now
    ("42P01", pg.UndefinedTableError, HOLD, "undefined_object"),
    ("42703", pg.UndefinedColumnError, HOLD, "undefined_object"),
    ("42704", pg.UndefinedObjectError, HOLD, "undefined_object"),
    ("42883", pg.UndefinedFunctionError, HOLD, "undefined_object"),
    ("3F000", pg.InvalidSchemaNameError, HOLD, "undefined_object"),
    ("3D000", pg.InvalidCatalogNameError, HOLD, "undefined_object"),
    ("57P04", pg.DatabaseDroppedError, HOLD, "undefined_object"),
    ("42501", pg.InsufficientPrivilegeError, HOLD, "insufficient_privilege"),
    ("28000", pg.InvalidAuthorizationSpecificationError, HOLD, "insufficient_privilege"),
    ("28P01", pg.InvalidPasswordError, HOLD, "insufficient_privilege"),
    ("25006", pg.ReadOnlySQLTransactionError, HOLD, "read_only"),
    ("53000", pg.InsufficientResourcesError, HOLD, "insufficient_resources"),
    ("53100", pg.DiskFullError, HOLD, "insufficient_resources"),
    ("53200", pg.OutOfMemoryError, HOLD, "insufficient_resources"),
    ("42601", pg.PostgresSyntaxError, HOLD, "schema_mismatch"),
    ("42804", pg.DatatypeMismatchError, HOLD, "schema_mismatch"),
    ("42P10", pg.InvalidColumnReferenceError, HOLD, "schema_mismatch"),
    ("58000", pg.PostgresSystemError, HOLD, "system_error"),
    ("58030", pg.PostgresIOError, HOLD, "system_error"),
    # operational, retried now (and held when retries run out)
    ("57P01", pg.AdminShutdownError, RETRY, "server_unavailable"),
    ("57P02", pg.CrashShutdownError, RETRY, "server_unavailable"),
    ("57P03", pg.CannotConnectNowError, RETRY, "server_unavailable"),
    ("57000", pg.OperatorInterventionError, RETRY, "server_unavailable"),
    ("53300", pg.TooManyConnectionsError, RETRY, "too_many_connections"),
    ("53400", pg.ConfigurationLimitExceededError, RETRY, "insufficient_resources"),
    # transient, retried now, not an operator's concern
    ("40001", pg.SerializationError, RETRY, None),
    ("40P01", pg.DeadlockDetectedError, RETRY, None),
    ("55P03", pg.LockNotAvailableError, RETRY, None),
    ("57014", pg.QueryCanceledError, RETRY, None),
    ("08000", pg.PostgresConnectionError, RETRY, None),
    ("08006", pg.ConnectionFailureError, RETRY, None),
    ("08001", pg.ClientCannotConnectError, RETRY, None),
    # about the data itself: parked
    ("22P02", pg.InvalidTextRepresentationError, PARK, None),
    ("22003", pg.NumericValueOutOfRangeError, PARK, None),
    ("22001", pg.StringDataRightTruncationError, PARK, None),
    ("22021", pg.CharacterNotInRepertoireError, PARK, None),
    ("22P05", pg.UntranslatableCharacterError, PARK, None),
    ("22007", pg.InvalidDatetimeFormatError, PARK, None),
    ("23502", pg.NotNullViolationError, PARK, None),
    ("23514", pg.CheckViolationError, PARK, None),
    ("23503", pg.ForeignKeyViolationError, PARK, None),
    ("23505", pg.UniqueViolationError, PARK, None),
    ("54000", pg.ProgramLimitExceededError, PARK, None),
    ("54001", pg.StatementTooComplexError, PARK, None),
    ("54023", pg.TooManyArgumentsError, PARK, None),
    # anything else: not retried, held, counts against the backend
    ("XX000", pg.InternalServerError, FATAL, None),
    ("0A000", pg.FeatureNotSupportedError, FATAL, None),
    ("P0001", pg.RaiseError, FATAL, None),
]


@pytest.mark.parametrize(
    ("code", "cls", "handling", "condition"), TABLE, ids=[f"{row[0]}-{row[1].__name__}" for row in TABLE]
)
def test_every_listed_sqlstate_has_its_handling(
    code: str, cls: type[asyncpg.PostgresError], handling: ErrorClass, condition: str | None
) -> None:
    error = server_error(code)
    assert type(error) is cls  # asyncpg's own class for the code
    assert error.sqlstate == code
    assert classify(error) is handling
    assert operational_condition(error) == condition
    assert sqlstate_handling(code) == (handling, condition)
    # Never the server's message: it quotes the row.
    assert safe_message(error) == f"SQLSTATE {code}"
    assert SECRET not in safe_message(error)


def test_the_findings_conditions_are_operational_never_parked() -> None:
    """Finding 6's list: missing table or column, privilege, read-only, shutdown, connections."""
    for cls in (
        pg.UndefinedTableError,
        pg.UndefinedColumnError,
        pg.InsufficientPrivilegeError,
        pg.ReadOnlySQLTransactionError,
        pg.AdminShutdownError,
        pg.CrashShutdownError,
        pg.CannotConnectNowError,
        pg.TooManyConnectionsError,
    ):
        error = server_error(cls.sqlstate)
        assert type(error) is cls
        assert classify(error) is not ErrorClass.REJECTED, cls.__name__
        assert operational_condition(error) in OPERATIONAL_CONDITIONS, cls.__name__


def test_codes_not_listed_fall_back_to_their_class() -> None:
    assert classify(server_error("42P07")) is HOLD  # duplicate_table: the schema, not the data
    assert operational_condition(server_error("42P07")) == "schema_mismatch"
    assert classify(server_error("22012")) is PARK  # division_by_zero
    assert classify(server_error("23P01")) is PARK  # exclusion_violation
    assert classify(server_error("08P01")) is RETRY  # protocol_violation
    assert classify(server_error("F0000")) is FATAL  # config_file_error


def test_condition_values_are_the_bounded_set_of_the_metric() -> None:
    assert OPERATIONAL_CONDITIONS == names.OPERATIONAL_CONDITIONS
    used = {condition for _, condition in [*SQLSTATE_HANDLING.values(), *SQLSTATE_CLASS_HANDLING.values()]}
    assert used - {None} == set(OPERATIONAL_CONDITIONS)
    assert names.OPERATIONAL_ERRORS == "guarded_store_operational_errors_total"


def test_connections_never_made_are_known_not_to_have_reached_the_server() -> None:
    for code in NOT_SENT_SQLSTATES:
        assert reached_backend(server_error(code)) is False
    assert reached_backend(server_error("42P01")) is True


def test_non_database_errors_keep_their_handling() -> None:
    assert classify(InvalidPayloadError("nan is not a valid JSON number")) is PARK
    assert classify(ValueError("bad")) is PARK
    assert classify(ConnectionResetError()) is RETRY
    assert classify(TimeoutError()) is RETRY
    assert classify(TypeError("bug")) is ErrorClass.PROGRAMMING
    assert classify(AttributeError("bug")) is ErrorClass.PROGRAMMING
    assert classify(RuntimeError("unknown")) is FATAL
    assert operational_condition(ConnectionResetError()) is None
    assert operational_condition(InvalidPayloadError("x")) is None


DOC = Path(__file__).resolve().parents[1] / "docs" / "durability.md"


def test_the_documented_table_matches_the_code() -> None:
    """Every SQLSTATE and class the code handles apart is in docs/durability.md with the same
    handling (a row ``| `code` ... | retry now / hold and replay / park |``)."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## What a failure means") :]
    words = {RETRY: "retry now", HOLD: "hold and replay", PARK: "park"}
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented: dict[str, str] = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        for code in re.findall(r"`([0-9A-Z]{2}(?:[0-9A-Z]{3}|xxx))`", cells[0]):
            documented[code] = cells[-1]
    for code, (handling, _) in SQLSTATE_HANDLING.items():
        assert documented.get(code, "").startswith(words[handling]), code
    for prefix, (handling, _) in SQLSTATE_CLASS_HANDLING.items():
        assert documented.get(f"{prefix}xxx", "").startswith(words[handling]), prefix
