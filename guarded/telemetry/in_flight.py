"""Which tasks are in flight, by the labels they were spawned with; bounded.

A task is counted from its ``task_spawned`` event until its first ``task_completed``,
``task_failed`` or ``task_cancelled`` event, under the ``(task_type, mode)`` of its spawn: PenguiFlow
3.11 reports a foreground task's mode as ``foreground`` when it is spawned but ``subagent`` when it
ends, so decrementing the end event's own labels would leave one series forever positive and push
another below zero. An end event for a task this process never saw spawned (it was spawned before
the process started, or by another process) changes nothing, so no series goes below zero. A
spawn created before its task's end but delivered after it (out of order) is ignored; a task id
spawned again after it ended counts again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

InFlightLabels = tuple[str, str]
"""``(task_type, mode)``."""

DEFAULT_MAX_TASKS = 100_000


class InFlightTasks:
    """Tasks spawned and not yet ended, at most ``max_tasks``.

    ``adjust(labels, delta)`` is called for every change of a series (``+1`` on a spawn, ``-1`` on
    an end). Beyond ``max_tasks`` the oldest task is forgotten and its series decremented, so the
    exported value always equals the tasks tracked here.
    """

    def __init__(
        self, adjust: Callable[[InFlightLabels, int], None], *, max_tasks: int = DEFAULT_MAX_TASKS
    ) -> None:
        if max_tasks < 1:
            raise ValueError(f"max_tasks must be at least 1, not {max_tasks}")
        self._adjust = adjust
        self._max = max_tasks
        self._running: OrderedDict[str, InFlightLabels] = OrderedDict()
        self._ended: OrderedDict[str, float | None] = OrderedDict()
        """Recently ended tasks and when their end event was created."""
        self.forgotten = 0
        """Tasks dropped from tracking because more than ``max_tasks`` were in flight."""

    def __len__(self) -> int:
        return len(self._running)

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._running

    def spawned(self, task_id: str | None, labels: InFlightLabels, created_at: float | None = None) -> None:
        """Count ``task_id`` as in flight under ``labels`` (once, however often it is reported).

        ``created_at`` is when the spawn event was created (``created_at_s``)."""
        if task_id is None or task_id in self._running:
            return
        if task_id in self._ended:
            ended_at = self._ended[task_id]
            if created_at is None or ended_at is None or created_at <= ended_at:
                return
            del self._ended[task_id]
        self._running[task_id] = labels
        self._adjust(labels, 1)
        if len(self._running) > self._max:
            _, oldest = self._running.popitem(last=False)
            self.forgotten += 1
            self._adjust(oldest, -1)

    def ended(self, task_id: str | None, created_at: float | None = None) -> None:
        """Stop counting ``task_id`` (nothing happens when it was not counted).

        ``created_at`` is when the end event was created (``created_at_s``)."""
        if task_id is None:
            return
        labels = self._running.pop(task_id, None)
        self._ended[task_id] = created_at
        self._ended.move_to_end(task_id)
        if len(self._ended) > self._max:
            self._ended.popitem(last=False)
        if labels is not None:
            self._adjust(labels, -1)
