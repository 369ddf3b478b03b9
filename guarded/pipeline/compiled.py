"""A guarded method's layers compiled into one coroutine for the success path.

Each layer keeps its own module and its ``wrap()``, the layered chain that handles every call the
success path cannot. A layer also declares :class:`Hooks` for the success path: ``before`` (sync,
before the backend call, in declared order: it may send the call to the chain instead),
``after`` (after the backend answered, innermost first) and ``undo`` (give back what ``before``
took when a later hook sends the call to the chain). :func:`compile_method` inlines them around
the backend call with the attempt's own bounds (bulkhead permit, per-attempt timeout), so the
common call runs in one frame.

A failure leaves the success path for the chain: the attempt's own bounds are settled at once
(the timeout's verdict, the permit given back), then the chain takes the call over with the
failure *preloaded* (:attr:`Call.preloaded <guarded.pipeline.call.Call.preloaded>`): the chain's first
attempt raises it instead of calling the backend again, so retry, breaker, dead-letter, stale
reads and fallback handle it in their declared order, exactly as if the chain had made that
attempt. What a ``before`` hook took that the chain must keep (the breaker's admission, the
dead-letter layer's stamp and key slot) is adopted by that layer's ``wrap()`` from the call.

A layer that declares no hooks for a method, and does not leave the method alone, keeps the
method on the chain: your own layers (``extra_layers``) never lose their place.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import CodeType
from typing import Any

from .call import Call, Layer, MethodSetup, Service
from .loops import LoopHome
from .watchdog import attempt_timed_out, watchdog_for


@dataclass(frozen=True, slots=True)
class Hooks:
    """One layer's part of a method's success path (see the module docs)."""

    before: Callable[[Call], bool] | None = None
    """Before the backend call: ``False`` (or an exception) sends the call to the layered chain."""
    undo: Callable[[Call], None] | None = None
    """Gives back what ``before`` took when a later ``before`` sends the call to the chain."""
    after: Callable[[Call, Any], Any] | None = None
    """After the backend answered: returns the answer the caller gets (usually ``result``)."""
    after_is_async: bool = False
    """``after`` is a coroutine function (awaited)."""
    on_failure: Callable[[Call, BaseException], Any] | None = None
    """The must-not-throw layer's answer to a failure of an ``after`` hook inside it (it raises
    what it does not answer, as its ``wrap()`` lets it through)."""
    terminal: Service | None = None
    """The layer ends the call itself and never calls the layers inside it (the batching layer
    hands a write to the batcher): the success path awaits this instead of the backend, then this
    layer's own ``after`` (when it declares one) on what it returned; a failure either raises is
    final (the layers outside meet it as ``after_failed`` does)."""
    on_raise: Callable[[Call, BaseException], None] | None = None
    """A failure passes through this layer on its way to the caller (the metrics layer counts the
    call, as its ``wrap()`` does)."""
    after_may_defer: bool = False
    """``after`` answers at once, or with a :class:`Deferred` when it must wait (then awaited):
    a hook that rarely waits need not be a coroutine for every call."""
    after_unless: Any = None
    """When not ``None``: ``after`` is not called for a result that *is* this object (the answer is
    ``None``), as ``after`` itself would answer it (the batching layer's usual ``ok``)."""


PASS = Hooks()
"""The hooks of a layer that leaves a method alone."""


class Deferred:
    """What an ``after`` hook declared ``after_may_defer`` answers when it must wait: the
    awaitable of its answer."""

    __slots__ = ("awaitable",)

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        self.awaitable = awaitable


class Attempt:
    """The attempt's own bounds on the success path: the bulkhead's permit and the per-attempt
    timeout, declared by the layers inside retry (their ``attempt_hooks``)."""

    __slots__ = ("acquire", "attempt_timeout", "release", "stats", "succeeded")

    def __init__(
        self,
        *,
        attempt_timeout: float | None,
        acquire: Callable[[], bool] | None = None,
        release: Callable[[], None] | None = None,
        succeeded: Callable[[], None] | None = None,
        stats: Any = None,
    ) -> None:
        self.attempt_timeout = attempt_timeout
        self.acquire = acquire
        self.release = release
        self.succeeded = succeeded
        self.stats = stats


def compile_method(
    layers: Sequence[Layer],
    setup: MethodSetup,
    backend: Service,
    chain: Service,
    home: LoopHome | None = None,
) -> Service | None:
    """The compiled service of ``setup``'s method, or ``None`` when a layer keeps it on ``chain``.
    Its ``entry`` runs a call made on another event loop than ``home``'s on that loop.

    ``layers`` are in declared order (outermost first); those inside the retry layer must declare
    their attempt bounds (``attempt_hooks``), the others their :class:`Hooks`.
    """
    outer: list[Hooks] = []
    terminal: Service | None = None
    attempt_timeout: float | None = None
    acquire = release = succeeded = None
    stats: Any = None
    inside_retry = False
    for layer in layers:
        if getattr(layer, "retry_boundary", False):
            inside_retry = True
            continue
        if inside_retry:
            bounds = getattr(layer, "attempt_hooks", None)
            found = bounds(setup) if bounds is not None else None
            if found is None:
                return None
            if found.attempt_timeout is not None:
                attempt_timeout = found.attempt_timeout
            if found.acquire is not None:
                acquire, release = found.acquire, found.release
                succeeded, stats = found.succeeded, found.stats
            continue
        declare = getattr(layer, "hooks", None)
        if declare is not None:
            hooks = declare(setup)
        else:
            hooks = PASS if layer.wrap(_probe, setup) is _probe else None
        if hooks is None:
            return None
        if hooks.terminal is not None:
            terminal = hooks.terminal  # the layers inside it never see this method's calls
            if hooks.after is not None:  # its own answer to what its terminal step returned
                outer.append(
                    dataclasses.replace(
                        hooks, before=None, undo=None, terminal=None, on_failure=None, on_raise=None
                    )
                )
            break
        if hooks is not PASS:
            outer.append(hooks)
    if terminal is None and (not inside_retry or attempt_timeout is None):
        return None
    return _build(
        setup,
        outer,
        terminal or backend,
        chain,
        attempt_timeout or 0.0,
        acquire,
        release,
        succeeded,
        stats,
        terminal=terminal is not None,
        home=home,
    )


def _build(
    setup: MethodSetup,
    outer: list[Hooks],
    backend: Service,
    chain: Service,
    attempt_timeout: float,
    acquire: Callable[[], bool] | None,
    release: Callable[[], None] | None,
    succeeded: Callable[[], None] | None,
    stats: Any,
    *,
    terminal: bool = False,
    home: LoopHome | None = None,
) -> Service:
    befores = [hooks for hooks in outer if hooks.before is not None]
    undos = [hooks.undo for hooks in reversed(befores) if hooks.undo is not None]
    afters = [
        hooks
        for hooks in reversed(outer)
        if hooks.after is not None or hooks.on_failure is not None or hooks.on_raise is not None
    ]
    current_task = asyncio.current_task
    label = setup.label
    last: list[Any] = [None, None]
    """The event loop of the last call and its watchdog."""

    async def leave_fast_path(call: Call, taken: int) -> Any:
        for hooks in reversed(befores[:taken]):
            if hooks.undo is not None:
                hooks.undo(call)
        try:
            return await chain(call)
        finally:
            call.answered()

    def watchdog(loop: asyncio.AbstractEventLoop) -> Any:
        dog = watchdog_for(loop)
        last[:] = loop, dog
        return dog

    async def _fail(call: Call, exc: BaseException | None, dog: Any, task: asyncio.Task[Any]) -> Any:
        """The attempt failed: settle its bounds as the timeout and bulkhead layers do, then hand
        the call to the chain with the failure preloaded."""
        if exc is None:
            failure = attempt_timed_out(label, None)
        else:
            failure = exc
            if dog.disarm(call) and task.uncancel() == 0:
                failure = attempt_timed_out(label, exc)
        if release is not None:
            release()
        call.preloaded = failure
        call.attempts = 0
        try:
            return await chain(call)
        finally:
            call.answered()
            if call.ticket is not None or call.held is not None or call.entered is not None:
                # The chain ended the call before the layer that adopts what a ``before`` hook
                # took (it refused the call on a second look): given back now.
                for hooks in undos:
                    hooks(call)

    async def after_failed(call: Call, exc: BaseException, stage: int) -> Any:
        """The ``after`` hook at ``stage`` raised (a caller's cancellation included): the layers
        outside it meet the failure as their ``wrap()`` would: the must-not-throw layer answers it
        (or lets it through), the metrics layer counts it, and the hooks outside an answer run."""
        failure: BaseException | None = exc
        result: Any = None
        for hooks in afters[stage + 1 :]:
            if failure is not None:
                if hooks.on_failure is not None:
                    try:
                        result = hooks.on_failure(call, failure)
                    except BaseException as again:
                        failure = again
                    else:
                        failure = None
                elif hooks.on_raise is not None:
                    hooks.on_raise(call, failure)
            elif hooks.after_unless is not None and result is hooks.after_unless:
                result = None
            elif hooks.after is not None:
                try:
                    result = hooks.after(call, result)
                    if hooks.after_is_async:
                        result = await result
                    elif type(result) is Deferred:
                        result = await result.awaitable
                except BaseException as again:
                    failure = again
        if failure is not None:
            raise failure
        return result

    namespace: dict[str, Any] = {
        "Call": Call,
        "Deferred": Deferred,
        "setup": setup,
        "backend": backend,
        "chain": chain,
        "leave_fast_path": leave_fast_path,
        "fail": _fail,
        "after_failed": after_failed,
        "current_task": current_task,
        "get_loop": asyncio.get_running_loop,
        "last": last,
        "watchdog": watchdog,
        "attempt_timeout": attempt_timeout,
        "acquire": acquire,
        "release": release,
        "succeeded": succeeded,
        "stats": stats,
        "home": home,
        "elsewhere": home.elsewhere if home is not None else None,
    }
    for index, hooks in enumerate(befores):
        namespace[f"before_{index}"] = hooks.before
    for index, hooks in enumerate(afters):
        namespace[f"after_{index}"] = hooks.after
        namespace[f"after_unless_{index}"] = hooks.after_unless
    with_permit = acquire is not None and not terminal
    source = _source(befores, afters, with_permit=with_permit, terminal=terminal, homed=home is not None)
    exec(_code(source, label), namespace)
    compiled: Service = namespace["compiled"]
    compiled.entry = namespace["entry"]  # type: ignore[attr-defined]
    return compiled


def _source(
    befores: Sequence[Hooks],
    afters: Sequence[Hooks],
    *,
    with_permit: bool,
    terminal: bool = False,
    homed: bool = False,
) -> str:
    """The success path's source: every hook called inline, in order (as ``dataclasses`` writes an
    ``__init__``). ``compiled(call)`` is the service; ``entry(*args, **kwargs)`` starts the call too."""
    body: list[str] = []
    if befores:
        body.append("taken = 0")
        body.append("try:")
        for index in range(len(befores)):
            indent = "    " * (index + 1)
            body.append(f"{indent}if before_{index}(call):")
            body.append(f"{indent}    taken = {index + 1}")
        body.append("except Exception:")
        body.append("    pass  # the chain meets it again and handles it (a caller's bad call: rejected)")
        body.append(f"if taken != {len(befores)}:")
        body.append("    return await leave_fast_path(call, taken)")
    if with_permit:
        body.append("if not acquire():")
        body.append(f"    return await leave_fast_path(call, {len(befores)})")
        body.append("stats.immediate += 1")
    if terminal:
        body += [
            "try:",
            "    result = await backend(call)  # the terminal layer's service",
            "except BaseException as exc:",
            "    return await after_failed(call, exc, -1)",
        ]
    else:
        body += _attempt_source(with_permit=with_permit)
    steps = [(index, hooks) for index, hooks in enumerate(afters) if hooks.after is not None]
    if steps:
        body.append("stage = 0")
        body.append("try:")
        for index, hooks in steps:
            awaited = "await " if hooks.after_is_async else ""
            body.append(f"    stage = {index}")
            step = [f"result = {awaited}after_{index}(call, result)"]
            if hooks.after_may_defer:
                step += ["if type(result) is Deferred:", "    result = await result.awaitable"]
            if hooks.after_unless is not None:
                body.append(f"    if result is after_unless_{index}:")
                body.append("        result = None")
                body.append("    else:")
                body.extend(f"        {line}" for line in step)
            else:
                body.extend(f"    {line}" for line in step)
        body.append("except BaseException as exc:")
        body.append("    return await after_failed(call, exc, stage)")
    body.append("return result")
    lines = ["async def compiled(call):", *("    " + line for line in body)]
    lines += [
        "async def entry(*args, **kwargs):",
        "    loop = get_loop()",
        *(_ON_OTHER_LOOP if homed else ()),
        "    call = Call(setup, args, kwargs, loop, loop.time())",
        *("    " + line for line in body),
    ]
    return "\n".join(lines) + "\n"


_ON_OTHER_LOOP = (
    "    if loop is not home.loop:",
    "        return await elsewhere(entry, setup, args, kwargs)",
)
"""A call made on another event loop than the guard's runs on the guard's (:mod:`.loops`)."""


@functools.lru_cache(maxsize=1024)
def _code(source: str, label: str) -> CodeType:
    """The code of a method's generated source, compiled once per process: every guard of a store
    with the same layers generates the same source for the method (its hooks are in the namespace
    the code runs in, not in the source)."""
    return compile(source, f"<guarded compiled {label}>", "exec")


def _attempt_source(*, with_permit: bool) -> list[str]:
    """The first attempt: armed by the watchdog, its failure handed to the chain (``fail``)."""
    lines = [
        "loop = call.loop",
        "task = current_task(loop)",
        "dog = last[1] if loop is last[0] else watchdog(loop)",
        "when = call.started + attempt_timeout",
        "if when > call.deadline:",
        "    when = call.deadline",
        "armed = dog.armed",
        "armed[call] = (task, when)  # dog.arm(call, task, when), inline",
        "if when < dog.wake_at:",
        "    dog.wake_by(when)",
        "call.attempts = 1",
        "try:",
        "    result = await backend(call)",
        "except BaseException as exc:",
        "    return await fail(call, exc, dog, task)",
        "if armed.pop(call, None) is None and task.uncancel() == 0:  # dog.disarm(call), inline",
        "    return await fail(call, None, dog, task)",
    ]
    if with_permit:
        lines += ["release()", "succeeded()"]
    return lines


def _probe(call: Call) -> Awaitable[Any]:
    """An inner service handed to a layer without hooks: one that returns it leaves the method alone."""
    raise AssertionError("never called")


def preloadable(backend: Service) -> Service:
    """``backend`` as the chain's innermost service: a call whose first attempt was made on the
    compiled success path raises that attempt's failure instead of calling the backend again."""

    def innermost(call: Call) -> Awaitable[Any]:
        failure = call.preloaded
        if failure is not None:
            call.preloaded = None
            return raising(failure)
        return backend(call)

    return innermost


async def raising(failure: BaseException) -> Any:
    """An awaitable that raises ``failure`` when awaited (a failure met before a call started,
    answered where the call's own failures are)."""
    raise failure


__all__ = ["PASS", "Attempt", "Deferred", "Hooks", "compile_method", "preloadable", "raising"]
