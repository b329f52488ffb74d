"""Registered handlers, by job kind."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from awa.core.kinds import derive_kind
from awa.errors import ValidationError
from awa.lifecycle.hooks import is_async_callable
from awa.model import check_name
from awa.producer.insert import TaskDefaults
from awa.worker.config import RetryPolicy


@dataclasses.dataclass(frozen=True, slots=True)
class Task:
    """A handler for one kind: called with an ``awa.Job`` whose args are ``args_type``."""

    kind: str
    args_type: type[Any] | None
    handler: Callable[..., Any]
    queue: str
    is_async: bool
    retry: RetryPolicy | None = None
    """Backoff for this kind's failed attempts, instead of its queue's."""


class TaskRegistry:
    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        self.routes: dict[str, str] = {}
        """kind -> the queue its task was registered on: where inserts without ``queue=``
        send it (``awa.producer.insert.InsertRules.routes``)."""
        self.defaults: dict[str, TaskDefaults] = {}
        """kind -> the insert options its task sets (``InsertRules.defaults``)."""

    def add(
        self,
        args_type: type[Any] | None,
        handler: Callable[..., Any],
        *,
        kind: str | None,
        queue: str,
        defaults: TaskDefaults | None = None,
        retry: RetryPolicy | None = None,
    ) -> Task:
        if kind is None:
            if args_type is None or not isinstance(args_type, type):
                raise ValidationError("task() needs an args class, or kind= for dict args")
            kind = derive_kind(args_type.__name__)
        check_name("kind", kind)
        check_name("queue", queue)
        if not callable(handler):
            raise ValidationError(f"the handler for {kind!r} is not callable")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ValidationError(f"task {kind!r}: retry must be an awa.RetryPolicy")
        task = Task(kind, args_type, handler, queue, is_async_callable(handler), retry)
        self._tasks[kind] = task
        self.routes[kind] = queue
        if defaults is not None and defaults != TaskDefaults():
            self.defaults[kind] = defaults
        else:
            self.defaults.pop(kind, None)
        return task

    def get(self, kind: str) -> Task | None:
        return self._tasks.get(kind)

    def __contains__(self, kind: object) -> bool:
        return kind in self._tasks

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks.values())

    def __len__(self) -> int:
        return len(self._tasks)

    def queues(self) -> list[str]:
        return list(dict.fromkeys(task.queue for task in self._tasks.values()))
