"""Steering records (spec 000, "SteeringEvent")."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import BaseModel, Field

from ._time import utc_now


class SteeringEventType(str, Enum):
    """Kind of a user or system intervention in a running task."""

    INJECT_CONTEXT = "INJECT_CONTEXT"
    REDIRECT = "REDIRECT"
    CANCEL = "CANCEL"
    PRIORITIZE = "PRIORITIZE"
    PAUSE = "PAUSE"
    RESUME = "RESUME"
    APPROVE = "APPROVE"
    REJECT = "REJECT"
    USER_MESSAGE = "USER_MESSAGE"


class SteeringEvent(BaseModel):
    """A bidirectional control event. Payloads are untrusted: stores persist the sanitized form."""

    session_id: str
    task_id: str
    event_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    event_type: SteeringEventType
    payload: dict[str, Any] = Field(default_factory=dict)
    trace_id: str | None = None
    source: str = "user"
    created_at: datetime = Field(default_factory=utc_now)

    def to_injection(self) -> str:
        """Render the event as the JSON snippet PenguiFlow injects into the LLM prompt."""
        return json.dumps(
            {
                "steering": {
                    "event_id": self.event_id,
                    "task_id": self.task_id,
                    "event_type": self.event_type.value,
                    "payload": dict(self.payload),
                    "created_at": self.created_at.isoformat(),
                }
            },
            ensure_ascii=False,
        )
