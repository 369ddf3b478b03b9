"""A scripted inner service, as tower-test's mock: the test says what each call the layer makes
must get (a value, an error, a hang), and the service fails the test on a call it did not expect."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any

from guarded.pipeline.call import Call


@dataclass(frozen=True, slots=True)
class _Answer:
    value: Any = None
    error: BaseException | None = None
    hang: bool = False
    swallow_cancel: bool = False


class ScriptedService:
    """``service.answer(value)``, ``service.fail(error)``, ``service.hang()``: the next call made
    through it gets that; ``service.calls`` are the calls it got, ``assert_done()`` says every
    scripted answer was taken."""

    def __init__(self) -> None:
        self._script: deque[_Answer] = deque()
        self.calls: list[Call] = []

    def answer(self, value: Any = None) -> ScriptedService:
        self._script.append(_Answer(value=value))
        return self

    def fail(self, error: BaseException) -> ScriptedService:
        self._script.append(_Answer(error=error))
        return self

    def hang(self, *, swallow_cancel: bool = False) -> ScriptedService:
        """The next call never answers; with ``swallow_cancel`` it returns ``None`` when
        cancelled, as a store that catches ``CancelledError`` would."""
        self._script.append(_Answer(hang=True, swallow_cancel=swallow_cancel))
        return self

    async def __call__(self, call: Call) -> Any:
        self.calls.append(call)
        if not self._script:
            raise AssertionError(f"unexpected call #{len(self.calls)} of {call.method.label}")
        answer = self._script.popleft()
        if answer.hang:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if answer.swallow_cancel:
                    return None
                raise
        if answer.error is not None:
            raise answer.error
        return answer.value

    def assert_done(self) -> None:
        assert not self._script, f"{len(self._script)} scripted answers were never asked for"


class GatedService:
    """An inner service whose calls (named by their first argument) stay in until :meth:`finish`;
    it counts how many are in at once (``active``, ``peak``)."""

    def __init__(self) -> None:
        self.entered: list[str] = []
        self.active = 0
        self.peak = 0
        self._gates: dict[str, asyncio.Event] = {}

    def _gate(self, name: str) -> asyncio.Event:
        return self._gates.setdefault(name, asyncio.Event())

    async def __call__(self, call: Call) -> str:
        name = str(call.args[0])
        self.entered.append(name)
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await self._gate(name).wait()
        finally:
            self.active -= 1
        return name

    def finish(self, name: str) -> None:
        self._gate(name).set()
