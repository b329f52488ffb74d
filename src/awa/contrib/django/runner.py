"""The awa handler that runs Django tasks in the worker.

It imports the task named in the job's args, calls it (an ``async def`` task on the
worker's event loop, a plain one in a thread with Django's connection hygiene around it)
and records its return value as the job's output. A task that raises fails the attempt
with its exception (retried only when the backend's MAX_ATTEMPTS allows); a task that
cannot be imported, or whose return value is not JSON, fails the job at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import logging
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.utils import timezone

from awa.contrib.django import compat
from awa.contrib.django.results import load_task, task_result
from awa.errors import TerminalError
from awa.job import Job

log = logging.getLogger("awa.contrib.django")

# Plain tasks run here. Threads start on demand and the queues' slots bound how many tasks
# run at once, so the cap only has to stay above any sensible number of slots (the event
# loop's default executor stops at 32 on most machines).
_threads = concurrent.futures.ThreadPoolExecutor(max_workers=512, thread_name_prefix="awa-task")


async def run_django_task(job: Job[dict[str, Any]]) -> None:
    """Handler of ``django_task`` jobs (registered on ``get_client()``)."""
    args = job.args
    try:
        task = load_task(args, job.queue)
    except ImportError as error:  # its message names the task
        raise TerminalError(str(error)) from None
    except Exception as error:
        raise TerminalError(f"cannot run the task {args.get('task')!r}: {error}") from None
    result = task_result(task, job.snapshot(), args)
    call_args = list(args.get("args", []))
    if task.takes_context:
        call_args.insert(0, compat.TaskContext(task_result=result))
    kwargs = dict(args.get("kwargs", {}))
    loop = asyncio.get_running_loop()
    # Signal receivers run in a worker thread, as in a sync view: they may use the ORM.
    await loop.run_in_executor(_threads, _send, compat.task_started, result)
    try:
        if inspect.iscoroutinefunction(task.func):
            value = await _call_async(task.func, call_args, kwargs)
        else:
            call = functools.partial(_call_sync, task.func, call_args, kwargs)
            value = await loop.run_in_executor(_threads, contextvars.copy_context().run, call)
        _record_output(job, task, value)
    except Exception as error:
        # (A CancelledError is a shutdown or a rescue: the job is not finished.)
        _finish(result, compat.TaskResultStatus.FAILED)
        await loop.run_in_executor(_threads, _send_failed, result, error)
        raise
    object.__setattr__(result, "_return_value", job.output)
    _finish(result, compat.SUCCESSFUL)
    await loop.run_in_executor(_threads, _send, compat.task_finished, result)


async def _call_async(func: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    # The task's ORM calls run in asgiref's thread: keep that thread's connections fresh.
    await sync_to_async(close_old_connections)()
    try:
        return await func(*args, **kwargs)
    finally:
        await sync_to_async(close_old_connections)()


def _call_sync(func: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    # As Django does around a request: drop connections that broke or outlived their
    # CONN_MAX_AGE, in the thread that uses them.
    close_old_connections()
    try:
        return func(*args, **kwargs)
    finally:
        close_old_connections()


def _record_output(job: Job[Any], task: Any, value: Any) -> None:
    """Store the return value as the job's output; a value JSON cannot hold fails the job
    now (running it again would not help)."""
    try:
        job.record_output(compat.normalize_json(value))
    except (TypeError, ValueError) as error:  # awa's ValidationError is a ValueError
        raise TerminalError(
            f"the return value of task {task.module_path!r} cannot be stored as JSON: {error}"
        ) from None


def _send(signal: Any, result: Any) -> None:
    if signal is None:
        return
    # A failing receiver is logged, not allowed to change the task's outcome.
    for receiver, response in signal.send_robust(sender=_backend_class(result), task_result=result):
        if isinstance(response, Exception):
            log.error("task signal receiver %r raised", receiver, exc_info=response)


def _finish(result: Any, status: Any) -> None:
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())


def _send_failed(result: Any, error: BaseException) -> None:
    """task_finished for a failed task, sent while ``error`` is being handled: receivers
    (Django's own logging one among them) read it from ``sys.exc_info()``."""
    traceback = error.__traceback__
    try:
        raise error
    except BaseException:
        _send(compat.task_finished, result)
    finally:
        error.__traceback__ = traceback  # as the worker will format it


def _backend_class(result: Any) -> type:
    return type(result.task.get_backend())
