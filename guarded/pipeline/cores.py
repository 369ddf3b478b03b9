"""Which guard stands behind which proxy: the proxy holds nothing of its own, so that it mirrors
the store exactly; its core is found here (weakly: a proxy collected takes its core with it)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..guard import GuardCore

_cores: weakref.WeakKeyDictionary[object, GuardCore] = weakref.WeakKeyDictionary()


def register(proxy: object, core: GuardCore) -> None:
    """Record ``core`` as what stands behind ``proxy``."""
    _cores[proxy] = core


def core_of(proxy: object) -> GuardCore | None:
    """What stands behind a guard proxy, ``None`` for anything else."""
    try:
        return _cores.get(proxy)
    except TypeError:  # not weakly referenceable: no proxy
        return None


__all__ = ["core_of", "register"]
