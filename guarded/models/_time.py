from datetime import UTC, datetime


def utc_now() -> datetime:
    """The current time as an aware UTC datetime (the spec's ``_utc_now``)."""
    return datetime.now(UTC)
