"""``with guarded.testing.strict(): ...``: every guard raises the caller's bugs (see
:mod:`guarded.pipeline.strict_mode`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..pipeline.strict_mode import forcing


@contextmanager
def strict() -> Iterator[None]:
    """Within the block, every guard of the process — built before or inside it — is strict: a
    call rejected as the caller's bug (arguments that do not bind, a wrong type, bad data) or
    failing with a programming error raises to the caller instead of returning the fallback.
    Store failures (timeouts, connection loss, an open breaker) still degrade as in production.

    ::

        from guarded.testing import strict

        with strict():
            await store.save_event("not an event")  # raises guarded.errors.CallerError
    """
    with forcing():
        yield
