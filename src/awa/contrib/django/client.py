"""The process's awa client for Django: ``get_client()``.

It connects to the jobs' database (``settings.AWA``) and has the handler of Django tasks
registered; register your own awa tasks on it in the modules that
``settings.AWA['TASK_MODULES']`` lists, and ``manage.py awa_worker`` runs them too.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from awa.client.asyncio_client import AsyncClient
from awa.contrib.django import conf
from awa.contrib.django.mapping import KIND
from awa.job import Job

_lock = threading.Lock()
_client: AsyncClient | None = None


def get_client() -> AsyncClient:
    """The process's ``awa.AsyncClient`` on the jobs' database, created on first use with
    the ``django_task`` handler registered. Register awa tasks on it before the worker
    starts (``@get_client().task(MyArgs, queue="email")``)."""
    global _client
    with _lock:
        if _client is None:
            settings = conf.load()
            client = AsyncClient(settings.url)
            client.task(None, kind=KIND)(_run_django_task)
            _client = client
        return _client


async def _run_django_task(job: Job[Any]) -> None:
    # Imported on first use: awa tasks alone need no Django task API installed.
    from awa.contrib.django.runner import run_django_task

    await run_django_task(job)


def import_task_modules(settings: conf.AwaSettings) -> None:
    """Import ``settings.AWA['TASK_MODULES']``, whose imports register awa tasks; a module
    that is not there raises ImproperlyConfigured naming it."""
    for name in settings.task_modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is None or not (name + ".").startswith(error.name + "."):
                raise  # the module exists; something it imports does not
            raise ImproperlyConfigured(
                f"settings.AWA['TASK_MODULES'] names {name!r}, which cannot be imported: "
                f"no module named {error.name!r}"
            ) from None


def worker_queues(client: AsyncClient, settings: conf.AwaSettings) -> Any:
    """``start()``'s queues for the worker: ``settings.AWA['QUEUES']`` if set, else the
    queues the awa task backends accept (their ``QUEUES``) and those the client's awa
    tasks declare, each with awa's default settings."""
    if settings.queues is not None:
        return settings.queues
    names: list[str] = []
    if hasattr(django_settings, "TASKS"):
        from awa.contrib.django.backend import AwaTaskBackend
        from awa.contrib.django.compat import task_backends

        for backend in task_backends.all():
            if isinstance(backend, AwaTaskBackend):
                names.extend(sorted(backend.queues))
    names.extend(client._tasks.queues())  # as `awa worker` reads them
    return {name: {} for name in dict.fromkeys(names)}
