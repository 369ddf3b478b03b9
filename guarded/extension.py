"""What you use to extend the guard: a layer of your own, or method policies of your own.

**A layer** (``guard(store, extra_layers=[...])``) is a :class:`Layer`: its ``wrap(inner, method)``
is called once per method when the guard is built (``method`` is that method's
:class:`MethodSetup`: its policy and resolved settings) and returns the :class:`Service` that runs
the method's calls; each call is a :class:`Call` (its arguments, deadline, attempts and outcome).
Your layers run innermost, between the timeout layer and the store. A layer may instead declare a
:class:`Step` per method (``step(method, inner)``, as every built-in layer does; subclass
:class:`StepLayer` for its ``wrap``): what it does before the layers inside it (``enter``), with
their answer (``ok``) and with their failure (``failed``). The steps of consecutive such layers
run in one coroutine; a hook that must wait raises :class:`Deferred`, and an ``enter`` that answers
the call itself returns :class:`Handled`.

**A policy** (``guard(store, policies={...})``) says what a method is: a :class:`MethodPolicy`
written in the vocabulary of :class:`Kind`, :class:`Fallback`, :class:`Merge`, :class:`Ids`,
:class:`Argument` and the argument getters :func:`arg` and :func:`attr_of`. The built-in table is a
:class:`PolicyTable`; ``controller(store).policy(name)`` gives the policy a method runs under.

``controller(store).breaker`` is the guard's :class:`CircuitBreaker` (its state is a
:class:`guarded.BreakerState`).

The backend interface (what a store may read of a call and declare to the guard) is
:mod:`guarded.backend`; the StateStore protocol and its capabilities are :mod:`guarded.protocol`.
"""

from __future__ import annotations

from .layers.breaker import CircuitBreaker
from .pipeline.call import Call, Layer, MethodSetup, Service
from .pipeline.steps import Deferred, Handled, Step, StepLayer
from .policy import Argument, Fallback, Ids, Kind, Merge, MethodPolicy, arg, attr_of
from .policy_table import PolicyTable

__all__ = [
    "Argument",
    "Call",
    "CircuitBreaker",
    "Deferred",
    "Fallback",
    "Handled",
    "Ids",
    "Kind",
    "Layer",
    "Merge",
    "MethodPolicy",
    "MethodSetup",
    "PolicyTable",
    "Service",
    "Step",
    "StepLayer",
    "arg",
    "attr_of",
]
