"""``AwaTaskBackend``: Django's task API on awa.

``TASKS = {"default": {"BACKEND": "awa.contrib.django.AwaTaskBackend"}}``; the backend's
``OPTIONS`` may set ``MAX_ATTEMPTS`` (default 1: a task that raises is FAILED, as Django's
API describes; more retries it with awa's backoff, READY in between) and
``DEADLINE_DURATION`` (seconds an attempt may run; default the queue's, 0 none).
``QUEUES`` lists the queue names tasks may use, as for every backend (an empty list allows
any).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from awa.contrib.django import compat, conf
from awa.contrib.django.mapping import KIND, awa_priority
from awa.contrib.django.results import job_args, load_task, task_result
from awa.contrib.django.store import ClientStore, DjangoStore, JobStore
from awa.model import BIGINT_MAX, MAX_DURATION

_OPTIONS = ("MAX_ATTEMPTS", "DEADLINE_DURATION")


class AwaTaskBackend(compat.BaseTaskBackend):  # type: ignore[misc]
    """Django task backend that enqueues each task as an awa job (in the caller's
    transaction, when the jobs live in a Django database) run by ``manage.py awa_worker``."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        where = f"TASKS[{alias!r}]['OPTIONS']"
        unknown = sorted(set(self.options) - set(_OPTIONS))
        if unknown:
            raise ImproperlyConfigured(
                f"{where} has unknown key(s) {unknown}; valid keys: {', '.join(_OPTIONS)}"
            )
        self.max_attempts = _int_option(where, self.options, "MAX_ATTEMPTS", 1, 1, 1000)
        self.deadline_duration = _seconds_option(where, self.options, "DEADLINE_DURATION")
        self._store: JobStore | None = None

    @property
    def store(self) -> JobStore:
        """Where this backend's jobs are written and read (settings.AWA decides)."""
        if self._store is None:
            settings = conf.load()
            if settings.database is not None:
                self._store = DjangoStore(settings.database)
            else:
                self._store = ClientStore(settings.url)
        return self._store

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Insert the task's job (in the open transaction of the jobs' Django database) and
        return its READY result; the result id is the job's id."""
        self.validate_task(task)
        payload = job_args(task, args, kwargs, self.alias)
        options: dict[str, Any] = {
            "kind": KIND,
            "queue": task.queue_name,
            "priority": awa_priority(task.priority),
            "max_attempts": self.max_attempts,
        }
        if task.run_after is not None:
            run_after = task.run_after
            if timezone.is_naive(run_after):  # allowed without USE_TZ: Django's zone
                run_after = timezone.make_aware(run_after)
            options["run_at"] = run_after
        if self.deadline_duration is not None:
            options["deadline_duration"] = self.deadline_duration
        row = self.store.insert(payload, **options)
        result = task_result(task, row, payload)
        compat.task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        """The result of the job with this id, as the database holds it now.

        TaskResultDoesNotExist for an id that names no Django task job; ImportError when
        the job's task cannot be imported in this process.
        """
        job_id = _job_id(result_id)
        row = self.store.get(job_id) if job_id is not None else None
        if row is None or row.kind != KIND or not isinstance(row.args, dict):
            raise compat.TaskResultDoesNotExist(result_id)
        return task_result(load_task(row.args, row.queue), row, row.args)


def _job_id(result_id: object) -> int | None:
    text = str(result_id)
    if not text.isascii() or not text.isdigit() or len(text) > len(str(BIGINT_MAX)):
        return None  # not a job id: no job has it
    job_id = int(text)
    return job_id if 0 < job_id <= BIGINT_MAX else None


def _int_option(
    where: str, options: dict[str, Any], key: str, default: int, low: int, high: int
) -> int:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ImproperlyConfigured(
            f"{where}[{key!r}] must be an integer from {low} to {high}, not {value!r}"
        )
    return value


def _seconds_option(where: str, options: dict[str, Any], key: str) -> float | None:
    value = options.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= MAX_DURATION.total_seconds()  # NaN and infinities too
    ):
        raise ImproperlyConfigured(
            f"{where}[{key!r}] must be seconds from 0 to {MAX_DURATION.total_seconds():.0f}, "
            f"not {value!r}"
        )
    return float(value)
