"""Building one method's :class:`~guarded.pipeline.call.MethodSetup` and
:class:`~guarded.pipeline.call.Call`, to drive a single layer without a guard around it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from guarded.config import Ack, BatchConfig, GuardConfig, RetryConfig, TimeoutConfig
from guarded.pipeline.call import Call, MethodSetup, Service
from guarded.pipeline.loops import LoopHome
from guarded.pipeline.steps import run_steps
from guarded.policy_table import PolicyTable


def method_setup(
    method: str = "load_memory_state",
    *,
    attempt: float = 2.0,
    deadline: float = 5.0,
    max_attempts: int = 3,
    honours_idempotency_key: bool = False,
    ack: Ack = "commit",
    policies: PolicyTable | None = None,
    label: str | None = None,
) -> MethodSetup:
    """What a layer knows about ``method`` of a store named ``"s"`` (its policy from ``policies``,
    the StateStore table unless given; ``label`` the method's metric label, ``method`` unless given)."""
    config = GuardConfig(
        timeout=TimeoutConfig(attempt=attempt, deadline=deadline, critical_deadline=deadline),
        retry=RetryConfig(max_attempts=max_attempts, critical_max_attempts=max_attempts),
        batching=BatchConfig(ack=ack),
    )
    policy = (policies or PolicyTable.for_state_store()).get(method)
    settings = config.for_method(method, critical=policy.critical)
    return MethodSetup(
        "s", label or method, policy, settings, honours_idempotency_key=honours_idempotency_key
    )


def new_call(setup: MethodSetup, *args: Any, **kwargs: Any) -> Call:
    """A call of ``setup``'s method starting now on the running loop."""
    loop = asyncio.get_running_loop()
    return Call(setup, args, kwargs, loop, loop.time())


def nested_build(
    layers: Sequence[Any],
    method: MethodSetup,
    backend: Service,
    *,
    answers: bool = False,
    home: LoopHome | None = None,
) -> Any:
    """The layers of a method nested one coroutine each (each wrapped around the next, as tower
    composes layers): the reference the guard's one coroutine of steps must answer alike. With
    ``home``, the method the caller calls (it starts its calls, as ``build``'s)."""
    service = backend
    for layer in reversed(layers):
        service = layer.wrap(service, method)
    return service if home is None else run_steps((), service, entry=(method, home))
