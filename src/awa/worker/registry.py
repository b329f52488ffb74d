"""Registered handlers, by job kind."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from awa.errors import ValidationError
from awa.kinds import derive_kind
from awa.lifecycle.hooks import is_async_callable
from awa.model import check_name


@dataclasses.dataclass(frozen=True, slots=True)
class Task:
    """A handler for one kind: called with an ``awa.Job`` whose args are ``args_type``."""

    kind: str
    args_type: type[Any] | None
    handler: Callable[..., Any]
    queue: str
    is_async: bool


class TaskRegistry:
    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}
        self.routes: dict[str, str] = {}
        """kind -> the queue its task was registered on: where inserts without ``queue=``
        send it (``awa.insert.Routes``)."""

    def add(
        self,
        args_type: type[Any] | None,
        handler: Callable[..., Any],
        *,
        kind: str | None,
        queue: str,
    ) -> Task:
        if kind is None:
            if args_type is None or not isinstance(args_type, type):
                raise ValidationError("task() needs an args class, or kind= for dict args")
            kind = derive_kind(args_type.__name__)
        check_name("kind", kind)
        check_name("queue", queue)
        if not callable(handler):
            raise ValidationError(f"the handler for {kind!r} is not callable")
        task = Task(kind, args_type, handler, queue, is_async_callable(handler))
        self._tasks[kind] = task
        self.routes[kind] = queue
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
