"""The call check: a call the caller got wrong never enters the rest of the layers; the caller's
bugs are the caller's.

A call whose arguments do not bind to the method's signature, or that passes an argument of the
wrong type (a string where a ``StoredEvent`` belongs, a list where a mapping does), would fail in
the backend — or, worse, be queued, acknowledged and parked later, or held and replayed for ever.
:func:`argument_check` builds, once per guarded method, a function that refuses such a call with
:class:`~guarded.errors.CallerError` before anything else sees it.

The signature is the backend's own. A backend that says nothing about its arguments (a delegating
wrapper whose methods take ``*args, **kwargs``) is checked against the
StateStore protocol's signature of the method. Which arguments are records, and of which type,
is a column of the policy table (:attr:`guarded.policy.MethodPolicy.arguments`). A record is
accepted when it is an instance of guarded's model or PenguiFlow's, or when it has every field
the stores read (the codec reads attributes).

A call is checked without building a ``BoundArguments`` (a few set and length comparisons, and
one ``isinstance`` per record argument); ``Signature.bind`` runs only to word a refusal.

:class:`CallCheckLayer` stands right inside the fallback layer: a refused call is ended
``rejected`` before stale reads, the dead-letter buffer, batching or the backend see it.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from ..codec import CODECS, DEFAULT_TYPES, installed_types
from ..error_classes import redact_quoted
from ..errors import CallerError
from ..pipeline.call import Call, MethodSetup, Service
from ..pipeline.steps import Step, StepLayer
from ..policy import Argument, MethodPolicy
from ..protocol import own_signature, protocol_signature

Check = Callable[[tuple[Any, ...], Mapping[str, Any]], None]
"""Raises :class:`~guarded.errors.CallerError` when a call's ``(args, kwargs)`` are wrong."""

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)

_UsualCall: TypeAlias = tuple[int, frozenset[str], frozenset[str], int | None, frozenset[type], Check]
"""See :func:`_usual_call`; last, the full check."""
_usual_calls: weakref.WeakKeyDictionary[Check, _UsualCall] = weakref.WeakKeyDictionary()
"""Of each check with a fast path: its usual call (for :func:`call_hook`)."""


def argument_check(label: str, method: object, policy: MethodPolicy) -> Check | None:
    """The check of the calls of ``method`` (the backend's callable, ``None`` when unknown),
    guarded as ``label`` with ``policy``; ``None`` when there is nothing to check."""
    signature = own_signature(method) or protocol_signature(policy.name)
    bind = _binder(label, signature) if signature is not None else None
    checks = [_argument_check(label, argument) for argument in policy.arguments]
    if bind is None and not checks:
        return None

    def check(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        if bind is not None:
            bind(args, kwargs)
        for check_argument in checks:
            check_argument(args, kwargs)

    return _with_fast_path(check, signature, policy.arguments)


def _with_fast_path(
    check: Check, signature: inspect.Signature | None, arguments: Sequence[Argument]
) -> Check:
    """``check``, answered in one function for the usual call: every required argument passed by
    position, optional ones (if any) by keyword, each record argument of exactly a type it
    accepts. Any other call takes ``check`` itself, which accepts and refuses the same calls."""
    usual = _usual_call(signature, arguments, check)
    if usual is None:
        return check
    arity, required, keywords, index, types, _ = usual

    def fast(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        # The usual call's test (call_hook's, in a call's frame): the count by position, the
        # names by keyword, the typed argument's exact type.
        if (
            len(args) != arity
            or ((kwargs or required) and not required <= kwargs.keys() <= keywords)
            or (index is not None and type(args[index]) not in types)
        ):
            check(args, kwargs)

    _usual_calls[fast] = usual
    return fast


def _usual_call(
    signature: inspect.Signature | None, arguments: Sequence[Argument], check: Check
) -> _UsualCall | None:
    """The usual call of a method, when its check can answer it in one test: the required
    positional arguments' count, the keyword-only ones a call must pass, the names a call may pass
    by keyword (optional or required; none of them typed), the one typed required positional
    argument's position (``None`` when there is none) and its exact types."""
    if signature is None:
        return None
    arity, keyword_required = _required(signature)
    typed_names = {argument.name for argument in arguments}
    if typed_names.intersection(keyword_required):
        return None
    typed: list[tuple[int, frozenset[type]]] = []
    for argument in arguments:
        if argument.index >= arity:
            continue
        if argument.many:
            return None
        typed.append((argument.index, _exact_types(argument.expects)))
    if len(typed) > 1 or (typed and keyword_required):
        return None
    keywords = frozenset(
        parameter.name
        for position, parameter in enumerate(signature.parameters.values())
        if _by_keyword_beyond(parameter, position, arity)
        and (parameter.default is not inspect.Parameter.empty or parameter.name in keyword_required)
        and parameter.name not in typed_names
    )
    index, types = typed[0] if typed else (None, frozenset())
    return arity, frozenset(keyword_required), keywords, index, types, check


def _by_keyword_beyond(parameter: inspect.Parameter, position: int, arity: int) -> bool:
    """Whether a call passing ``arity`` arguments by position may pass ``parameter`` by keyword."""
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY:
        return True
    return parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and position >= arity


def call_hook(check: Check) -> Callable[[Call], None]:
    """``check`` of a :class:`~guarded.pipeline.call.Call` (raising the check's error), the usual
    call's arguments checked inline."""
    usual = _usual_calls.get(check)
    if usual is None:

        def checked(call: Call) -> None:
            check(call.args, call.kwargs)

        return checked
    arity, required, keywords, index, types, full_check = usual

    def checked_usual(call: Call) -> None:
        args, kwargs = call.args, call.kwargs
        if (
            len(args) != arity
            or ((kwargs or required) and not required <= kwargs.keys() <= keywords)
            or (index is not None and type(args[index]) not in types)
        ):
            full_check(args, kwargs)

    return checked_usual


def _exact_types(expects: str) -> frozenset[type]:
    """The types a value of ``expects`` may have for the fast path (subclasses take the full check)."""
    if expects in ("mapping", "trajectory"):
        return frozenset({dict})
    return frozenset({getattr(DEFAULT_TYPES, expects), getattr(installed_types(), expects)})


def _required(signature: inspect.Signature) -> tuple[int, tuple[str, ...]]:
    """How many positional parameters a call must pass (the required ones come first: Python's
    syntax says so), and the names of the keyword-only parameters it must pass."""
    parameters = signature.parameters.values()
    positional = sum(
        1
        for parameter in parameters
        if parameter.kind in _POSITIONAL and parameter.default is inspect.Parameter.empty
    )
    keyword_only = tuple(
        parameter.name
        for parameter in parameters
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.default is inspect.Parameter.empty
    )
    return positional, keyword_only


def _binder(label: str, signature: inspect.Signature) -> Check:
    parameters = list(signature.parameters.values())
    positional = [parameter.name for parameter in parameters if parameter.kind in _POSITIONAL]
    least, keyword_required = _required(signature)
    least_by_position = sum(
        1
        for parameter in parameters
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY
        and parameter.default is inspect.Parameter.empty
    )  # never given by keyword (a keyword of that name goes to **kwargs)
    kinds = {parameter.kind for parameter in parameters}
    most = float("inf") if inspect.Parameter.VAR_POSITIONAL in kinds else len(positional)
    any_keyword = inspect.Parameter.VAR_KEYWORD in kinds
    by_keyword = frozenset(
        parameter.name
        for parameter in parameters
        if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    )
    full_bind = signature.bind

    def binds(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
        count = len(args)
        if not least <= count <= most and not (count < least and kwargs):
            return False
        if not kwargs:
            return not keyword_required  # count >= least: checked above
        if count < least_by_position or (not any_keyword and not kwargs.keys() <= by_keyword):
            return False
        return (
            not any(name in kwargs for name in positional[:count])
            and all(name in kwargs for name in positional[count:least])
            and all(name in kwargs for name in keyword_required)
        )

    def bind(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        if binds(args, kwargs):
            return
        try:
            full_bind(*args, **kwargs)  # for Python's own words; binds() never refuses a good call
        except TypeError as exc:
            raise CallerError(f"{label}(): {redact_quoted(str(exc))}") from None

    return bind


def _argument_check(label: str, argument: Argument) -> Check:
    name, index = argument.name, argument.index
    accepts, expected = _acceptor(argument.expects)

    def check(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        if name in kwargs:
            value = kwargs[name]
        elif len(args) > index:
            value = args[index]
        else:
            return  # not passed: it has a default, or the backend's signature names it otherwise
        if not argument.many:
            if not accepts(value):
                raise CallerError(f"{label}(): argument {name!r} must be {expected}, got {_type(value)}")
            return
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise CallerError(
                f"{label}(): argument {name!r} must be a sequence (list or tuple) of "
                f"{argument.expects}, got {_type(value)}"
            )
        for position, item in enumerate(value):
            if not accepts(item):
                raise CallerError(
                    f"{label}(): argument '{name}[{position}]' must be {expected}, got {_type(item)}"
                )

    return check


def _acceptor(expects: str) -> tuple[Callable[[Any], bool], str]:
    """Whether a value is what ``expects`` names, and how a message names it."""
    if expects == "mapping":
        return (lambda value: isinstance(value, Mapping)), "a mapping (a dict)"
    if expects == "trajectory":
        return _is_trajectory, "a mapping or an object with serialise() (PenguiFlow's Trajectory)"
    return _record_acceptor(expects)


@functools.cache
def _record_acceptor(record: str) -> tuple[Callable[[Any], bool], str]:
    fields = tuple(field.name for field in CODECS[record].fields)
    classes = tuple({getattr(DEFAULT_TYPES, record), getattr(installed_types(), record)})

    def accepts(value: Any) -> bool:
        if isinstance(value, classes):
            return True
        try:
            return all(hasattr(value, field) for field in fields)
        except Exception:  # an attribute that raises something else than AttributeError
            return False

    return accepts, f"a {record} (guarded.models, PenguiFlow's, or an object with its fields)"


def _is_trajectory(value: Any) -> bool:
    if isinstance(value, Mapping):
        return True
    try:
        return callable(getattr(value, "serialise", None))
    except Exception:  # an attribute that raises something else than AttributeError
        return False


def _type(value: Any) -> str:
    """The type of ``value``, never the value: messages may be logged."""
    return type(value).__qualname__


class CallCheckLayer(StepLayer):
    """Checks each call of a method of ``target`` against the method's signature and argument types."""

    def __init__(self, target: object) -> None:
        self._target = target

    def step(self, method: MethodSetup, inner: Service) -> Step | None:
        check = self._check(method)
        if check is None:
            return None

        return Step(enter=call_hook(check))

    def _check(self, method: MethodSetup) -> Callable[[tuple[Any, ...], Mapping[str, Any]], None] | None:
        try:
            backend_method = getattr(self._target, method.policy.name, None)
        except Exception:  # an attribute that fails to evaluate: the protocol's signature then
            backend_method = None
        return argument_check(method.label, backend_method, method.policy)
