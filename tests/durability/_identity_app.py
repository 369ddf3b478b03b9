"""The template of a small application for the store-identity tests: a custom store of its own
class, kept in a JSON file (so it keeps its data across processes), guarded with every default.

``application(store_class)`` is the program's text; the test writes it to a file of its own, so
each application has its own main program and its own store class, as two programs of one user
would. ``python APP.py DATA_FILE up|down KEY VALUE``: with ``down`` every store call is refused
(the write is held); ``up`` drains what waits (its own held writes, left by an earlier run). The
program prints one JSON line once its write is acknowledged: ``{"held": n, "data": {...}}``, and
then, ``down``, waits to be killed; ``up`` closes the guard and exits.
"""

from __future__ import annotations

import textwrap

_TEMPLATE = '''
import asyncio
import json
import sys

from guarded import controller, guard


class {store_class}:
    """Keeps memory states in a JSON file; refuses every call while ``down``."""

    def __init__(self, path: str, down: bool) -> None:
        self.path = path
        self.down = down

    def _read(self) -> dict:
        try:
            with open(self.path) as file:
                return json.load(file)
        except FileNotFoundError:
            return {{}}

    def _check(self) -> None:
        if self.down:
            raise ConnectionRefusedError("the store is down")

    async def save_event(self, event) -> None:
        self._check()

    async def load_history(self, trace_id):
        self._check()
        return []

    async def save_remote_binding(self, binding) -> None:
        self._check()

    async def save_memory_state(self, key, state) -> None:
        self._check()
        data = self._read()
        data[key] = state
        with open(self.path, "w") as file:
            json.dump(data, file)

    async def load_memory_state(self, key):
        self._check()
        return self._read().get(key)


async def main() -> None:
    path, mode, key, value = sys.argv[1:5]
    store = {store_class}(path, down=mode == "down")
    guarded_store = guard(store, timeout=0.3)
    await guarded_store.save_memory_state(key, {{"value": value}})
    buffer = controller(guarded_store).dead_letters
    if mode == "down":
        print(json.dumps({{"held": buffer.depth if buffer else 0}}), flush=True)
        await asyncio.Event().wait()  # held, and killed here
    await controller(guarded_store).drain(10)
    held = buffer.depth if buffer else 0
    await controller(guarded_store).aclose()
    print(json.dumps({{"held": held, "data": store._read()}}), flush=True)


asyncio.run(main())
'''


def application(store_class: str) -> str:
    """The text of an application whose store is of class ``store_class``."""
    return textwrap.dedent(_TEMPLATE.format(store_class=store_class))
