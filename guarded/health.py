"""Liveness and readiness probes of a guarded store: :func:`health_app`, a plain ASGI app serving
``GET /livez`` and ``GET /readyz``, and :func:`probe`, the same answers for any other framework.

``/livez`` answers 200 while the guard is usable at all and 503 once it is closed: a backend
that is down never makes a process unlive (restarting it would only interrupt the replay).
``/readyz`` answers 200 while the health is ``ok`` or ``degraded`` and 503 when ``failing``
(the process cannot keep the writes it would be given). Both bodies are small JSON objects::

    {"status": "degraded", "reasons": [{"code": "breaker_open", "status": "degraded", "message": "..."}]}
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Literal

from .controller import ComposedController, GuardController, controller
from .health_status import Health, HealthReason, HealthStatus

Controls = GuardController | ComposedController
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Probe = Literal["livez", "readyz"]

LIVENESS_PATH = "/livez"
READINESS_PATH = "/readyz"


def controls_of(store_or_controller: object) -> Controls:
    """The controller of a guarded store, or the controller itself."""
    if isinstance(store_or_controller, (GuardController, ComposedController)):
        return store_or_controller
    return controller(store_or_controller)


def _closed(health: Health) -> bool:
    return any(reason.code == "guard_closed" for reason in health.reasons)


def _ready(health: Health) -> bool:
    return health.ready


def probe(
    store_or_controller: object, which: Probe, *, ready_when: Callable[[Health], bool] = _ready
) -> tuple[int, dict[str, Any]]:
    """The answer of the ``which`` probe (``"livez"`` or ``"readyz"``) as ``(status code, JSON
    body)``, for frameworks other than plain ASGI. ``livez`` fails (503) only when the guard is
    closed; ``readyz`` fails when ``ready_when(health)`` is false (by default: when the health
    is ``failing``; e.g. ``lambda health: health.status is HealthStatus.OK`` also takes a
    degraded pod out of the load balancer)."""
    health = controls_of(store_or_controller).health()
    passing = not _closed(health) if which == "livez" else ready_when(health)
    return (200 if passing else 503), health.as_json()


class HealthApp:
    """The ASGI app of :func:`health_app`."""

    def __init__(self, controls: Controls, *, ready_when: Callable[[Health], bool] = _ready) -> None:
        self.controls = controls
        self.ready_when = ready_when

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope.get("path", "")
        if path not in (LIVENESS_PATH, READINESS_PATH):
            await self._respond(send, 404, {"error": "not found"})
        elif scope.get("method") not in ("GET", "HEAD"):
            await self._respond(send, 405, {"error": "method not allowed"}, allow=True)
        else:
            which: Probe = "livez" if path == LIVENESS_PATH else "readyz"
            status, body = probe(self.controls, which, ready_when=self.ready_when)
            await self._respond(send, status, body, head=scope.get("method") == "HEAD")

    @staticmethod
    async def _lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    @staticmethod
    async def _respond(
        send: Send, status: int, body: dict[str, Any], *, head: bool = False, allow: bool = False
    ) -> None:
        content = json.dumps(body).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(content)).encode()),
            (b"cache-control", b"no-store"),
        ]
        if allow:
            headers.append((b"allow", b"GET, HEAD"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if head else content})


def health_app(store_or_controller: object, *, ready_when: Callable[[Health], bool] = _ready) -> HealthApp:
    """A plain ASGI app serving ``GET /livez`` and ``GET /readyz`` for a guarded store (or its
    controller; a composed store's answers the worst of its parts). Mount it beside your
    application (e.g. Starlette's ``Mount("/", health_app(store))``) or serve it on a port of its
    own. ``ready_when``: see :func:`probe`."""
    return HealthApp(controls_of(store_or_controller), ready_when=ready_when)


__all__ = ["Health", "HealthApp", "HealthReason", "HealthStatus", "health_app", "probe"]
