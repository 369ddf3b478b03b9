"""Layers as steps, and the one coroutine that runs a method's steps.

A layer of the guard declares, for each method, a :class:`Step`: what it does before the layers
inside it run (``enter``), with what they answered (``ok``), with what they raised (``failed``), or
that it answers the call in their place (``run``). :func:`build` runs the steps of consecutive
layers in one coroutine, so the usual call costs one frame however many layers stand around the
backend; each layer's logic exists once, in its step. A layer that is no step (your own, with only
``wrap(inner, method)``) nests as tower's layers do: the steps inside it are its ``inner``.

A step sees a call exactly as a ``wrap`` written around ``inner`` would: ``enter`` before ``await
inner(call)``, ``ok`` with its result, ``failed`` in its ``except BaseException``. A failure of
``enter`` is met by the layers outside it only; a failure of ``ok`` or of ``failed`` goes on outward.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .call import Call, Layer, MethodSetup, Service
from .loops import LoopHome


@dataclass(frozen=True, slots=True)
class Step:
    """One layer's part in one method's calls (see the module docs)."""

    enter: Callable[[Call], Any] | None = None
    """Before the layers inside: returns ``None`` to go on, an awaitable to wait for first (then go
    on), or :class:`Handled` when the layer answers this call itself; raises to fail the call here."""
    ok: Callable[[Call, Any], Any] | None = None
    """The layers inside answered ``result``: returns this layer's answer (raises :class:`Deferred`
    when it must wait for it)."""
    failed: Callable[[Call, BaseException], Any] | None = None
    """The layers inside raised: raises (the same or another) to pass it on, or returns this layer's
    answer (raises :class:`Deferred` when it must wait for it)."""
    run: Service | None = None
    """The layer ends the call itself and never calls the layers inside it (the batching layer hands
    a write to the batcher); ``ok`` and ``failed`` then see what ``run`` answered or raised."""
    counts_attempts: bool = False
    """The layer counts the call's attempts (:attr:`Call.attempts`): the first is counted for it,
    without a hook (one on every call costs as much as a layer's real work), the layer counts any
    further one itself. The count is made as the call starts and withdrawn when a layer outside
    this one refuses or answers the call, so the layers outside must not read it in ``enter``."""


class Deferred(BaseException):
    """What ``ok`` or ``failed`` raises when its answer must be waited for: ``raise
    Deferred(awaitable)``; what the awaitable returns or raises is the layer's answer. Raised, not
    returned, so that the usual answer is not checked for it (a hook that rarely waits need not be
    a coroutine for every call)."""

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        super().__init__()
        self.awaitable = awaitable


class Handled:
    """What ``enter`` returns when the layer answers the call itself (its slow path): the awaitable
    of the layer's answer, which calls the layers inside it (the ``inner`` its step was built with)
    as it needs. The layer's ``ok`` and ``failed`` are not called for this call."""

    __slots__ = ("awaitable",)

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        self.awaitable = awaitable


class StepLayer:
    """A layer declared as steps. ``wrap`` is what the steps make of one layer alone, so a step
    layer is used (and tested) like any other layer."""

    def step(self, method: MethodSetup, inner: Service) -> Step | None:
        """This layer's step for ``method`` (``None``: it leaves the method alone). ``inner`` runs
        the layers inside this one, for a layer that calls them again (retry) or itself."""
        raise NotImplementedError

    def wrap(self, inner: Service, method: MethodSetup) -> Service:
        service: Service = build([self], method, inner)
        return service


def build(
    layers: Sequence[Layer],
    method: MethodSetup,
    backend: Service,
    *,
    answers: bool = False,
    home: LoopHome | None = None,
) -> Any:
    """The service running ``layers`` (outermost first) around ``backend`` for ``method``: the
    steps of consecutive step layers in one coroutine, any other layer wrapped around them.
    ``answers``: the service gives the caller its answer (:meth:`Call.answered` once it has it).
    With ``home``, what is returned is the method the caller calls (its arguments, not a call):
    it starts the call itself, on ``home``'s loop."""
    service = backend
    steps: list[Step] = []
    """The steps gathered so far, innermost last, around ``service``."""
    for layer in reversed(layers):
        declare = getattr(layer, "step", None)
        if declare is None:
            service = layer.wrap(run_steps(steps, service), method)
            steps = []
            continue
        step = declare(method, run_steps(steps, service) if steps else service)
        if step is None:
            continue
        if step.run is not None:
            # The layers inside never see this method's calls.
            service, steps = step.run, [dataclasses.replace(step, run=None)]
        else:
            steps.insert(0, step)
    if home is not None:
        return run_steps(steps, service, answers=answers, entry=(method, home))
    return run_steps(steps, service, answers=answers)


def run_steps(
    steps: Sequence[Step],
    inner: Service,
    *,
    answers: bool = False,
    entry: tuple[MethodSetup, LoopHome] | None = None,
) -> Any:
    """One coroutine running ``steps`` (outermost first) around ``inner``; with ``answers``, a
    failed call's failure is forgotten once it has its answer (:meth:`Call.answered`). With
    ``entry``, the coroutine is called with the method's arguments and starts the call itself
    (the usual call then runs in this one frame); a call made on another event loop than the
    home's runs on the home's (:mod:`.loops`)."""
    if not steps and entry is None:
        return inner
    steps = tuple(steps)
    count = len(steps)
    hooks: list[tuple[Callable[[Call], Any], int]] = []
    count_at: int | None = None
    """Where among the enters the call's first attempt is counted (:attr:`Step.counts_attempts`)."""
    for index, step in enumerate(steps):
        if step.enter is not None:
            hooks.append((step.enter, index))
        if step.counts_attempts:
            if count_at is None:
                count_at = len(hooks)
            else:  # another layer that counts attempts (rare): a hook of its own
                hooks.append((_count_attempt, index))
    enters = tuple(hook for hook, _ in hooks)
    entered_at = tuple(index for _, index in hooks)
    """How many steps a call has entered when the enter at that position fails."""
    counts = count_at is not None
    uncounted = count_at if count_at is not None else 0
    """The enters before the count: a call they stop had no attempt."""
    oks = tuple(step.ok for step in reversed(steps) if step.ok is not None)
    ok_at = tuple(index for index in reversed(range(count)) if steps[index].ok is not None)
    """How many steps stand outside the ok at that position."""

    async def unwind(call: Call, failure: BaseException | None, result: Any, below: int) -> Any:
        """The steps ``[0, below)``, innermost first, see ``failure`` (or ``result``)."""
        for index in range(below - 1, -1, -1):
            step = steps[index]
            handler: Callable[[Call, Any], Any] | None
            if failure is not None:
                handler = step.failed
                if handler is None:
                    continue
                given: Any = failure
            else:
                handler = step.ok
                if handler is None:
                    continue
                given = result
            passed_through = given.__traceback__ if failure is not None else None
            try:
                result = handler(call, given)
            except Deferred as deferred:
                result = _waiting(deferred)
            except BaseException as again:
                failure, result = _passed_on(again, given, passed_through), None
                given = passed_through = None
                continue
            if result.__class__ is Deferred:
                try:
                    result = await result.awaitable
                except BaseException as again:
                    failure, result = _passed_on(again, given, passed_through), None
                    given = passed_through = None
                    continue
            failure = given = passed_through = None
        if failure is not None:
            try:
                raise failure
            finally:
                failure = None  # no reference cycle through this frame
        return result

    async def finish(call: Call, failure: BaseException | None, result: Any, below: int) -> Any:
        """:func:`unwind`, then, for the service that answers the caller, the failure forgotten."""
        try:
            return await unwind(call, failure, result, below)
        finally:
            if answers:
                call.answered()

    async def resume(call: Call, awaitable: Awaitable[Any], below: int) -> Any:
        """An ``ok`` deferred its answer to ``awaitable``: the steps outside it see what it gives."""
        try:
            result = await awaitable
        except BaseException as exc:
            return await finish(call, exc, None, below)
        return await finish(call, None, result, below)

    def stopped(call: Call, enter: Callable[[Call], Any]) -> int:
        """``enter`` failed or answered the call: how many steps the call entered. A call stopped
        before its first attempt is counted has none (:attr:`Step.counts_attempts`)."""
        position = enters.index(enter)
        if position < uncounted:
            call.attempts -= 1
        return entered_at[position]

    setup, home = entry if entry is not None else (None, None)
    elsewhere = home.elsewhere if home is not None else None
    get_loop = asyncio.get_running_loop

    async def run(*args: Any, **kwargs: Any) -> Any:
        if setup is None:
            call: Call = args[0]
        else:
            loop = get_loop()
            if loop is not home.loop:  # type: ignore[union-attr]
                return await elsewhere(run, setup, args, kwargs)  # type: ignore[misc]
            call = Call(setup, args, kwargs, loop, loop.time())
        if counts:
            call.attempts += 1  # withdrawn by stopped() when the call stops before the count
        for enter in enters:
            try:
                waiting = enter(call)
                if waiting is not None:
                    if waiting.__class__ is Handled:
                        break
                    await waiting
            except BaseException as exc:
                return await finish(call, exc, None, stopped(call, enter))
        else:
            try:
                result = await inner(call)
            except BaseException as exc:
                return await finish(call, exc, None, count)
            for ok in oks:
                try:
                    result = ok(call, result)
                except Deferred as deferred:
                    result = _waiting(deferred)
                    break
                except BaseException as exc:
                    return await finish(call, exc, None, ok_at[oks.index(ok)])
            else:
                return result
            return await resume(call, result.awaitable, ok_at[oks.index(ok)])
        # The layer of ``enter`` answers the call itself.
        below = stopped(call, enter)
        if below:
            return await resume(call, waiting.awaitable, below)
        # No step outside it (the tracing layer's span): its answer is the call's.
        try:
            return await waiting.awaitable
        finally:
            if answers:
                call.answered()

    return run


def _count_attempt(call: Call) -> None:
    """The count of a first attempt as a hook, for a second layer that counts attempts among the
    steps one coroutine runs (the first is counted in place)."""
    call.attempts += 1


def _waiting(deferred: Deferred) -> Deferred:
    """``deferred`` as caught, to be awaited once out of the ``except`` block (what fails then is
    not chained to it) and without the frames that raised it (they would keep the call)."""
    deferred.__traceback__ = None
    return deferred


def _passed_on(failure: BaseException, given: Any, passed_through: Any) -> BaseException:
    """What a handler raised; when it is the failure it was given, passed on as it came: without
    the frames that held it (each references it, and would keep it and the call in a cycle)."""
    if failure is given:
        failure.__traceback__ = passed_through
    return failure


async def raising(failure: BaseException) -> Any:
    """An awaitable that raises ``failure`` when awaited (a failure met before a call started,
    answered where the call's own failures are)."""
    raise failure


__all__ = ["Deferred", "Handled", "Step", "StepLayer", "build", "raising", "run_steps"]
