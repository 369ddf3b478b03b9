"""The Redis backend's part of the ``guarded`` command line (:data:`COMMAND_LINE`): which errors
mean the server could not be reached, which server :mod:`.redis_factory` tried, and the scratch key
prefix ``guarded check`` runs the contracts under (its keys are deleted afterwards).

This module imports redis-py only when asked about a Redis store or error, so the command line
works where the optional ``redis`` extra is not installed."""

from __future__ import annotations

import contextlib
import sys

from guarded.cli.plugin import BackendCommandLine, ScratchPlace, TargetTried, UsageError

FACTORY_MODULE = "guarded.backends.redis.redis_factory"
"""The module of the backend's own factory, as ``guarded check`` names it (``MODULE:create_store``)."""


def _redis_loaded() -> bool:
    return "redis" in sys.modules and "guarded.backends.redis.redis_store" in sys.modules


class RedisCommandLine(BackendCommandLine):
    """The Redis store as the other commands see it."""

    def is_unreachable(self, error: BaseException) -> bool:
        if not _redis_loaded():
            return False
        from redis import exceptions

        return isinstance(error, exceptions.ConnectionError | exceptions.TimeoutError)

    def factory_target(self, factory_module: str) -> TargetTried | None:
        if factory_module != FACTORY_MODULE:
            return None
        with contextlib.suppress(Exception):
            from .redis_factory import config_from_env

            config = config_from_env()
            where = config.url_without_password
            return TargetTried(
                f"{where}?prefix={config.prefix} (from GUARDED_REDIS_URL)",
                where,
                "set GUARDED_REDIS_URL and check that the server is up",
            )
        return None

    def scratch_variables(self, namespace: str) -> dict[str, str]:
        """The scratch key prefix."""
        return {"GUARDED_REDIS_PREFIX": namespace}

    def scratch_place(self, store: object, namespace: str, factory: str) -> ScratchPlace | None:
        if not _redis_loaded():
            return None
        from .redis_store import RedisStateStore

        if not isinstance(store, RedisStateStore):
            return None
        if store.prefix != namespace:
            raise UsageError(
                f"the store from {factory!r} uses the key prefix {store.prefix!r}, not the scratch prefix "
                f"{namespace} guarded check asked for, and the contracts would write under it",
                f"make the factory read GUARDED_REDIS_PREFIX, as {FACTORY_MODULE}:create_store does",
            )
        server = store.target_identity.split("?", 1)[0]
        return ScratchPlace(
            "redis_key_prefix",
            f"Redis keys {namespace}:* in {server}",
            target=server,
            drop_by_hand=f"redis-cli --scan --pattern '{namespace}:*' | xargs redis-cli unlink",
        )

    async def drop_scratch(self, store: object, namespace: str) -> None:
        from .redis_store import RedisStateStore

        if not isinstance(store, RedisStateStore) or store.prefix != namespace:
            return
        await store.drop_everything()


COMMAND_LINE = RedisCommandLine()
"""The backend's command line, listed in :data:`guarded.cli.plugin.BUILT_IN`."""

__all__ = ["COMMAND_LINE", "FACTORY_MODULE", "RedisCommandLine"]
