"""``manage.py awa_worker``: run an awa worker with the project's settings."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from awa.contrib.django import conf
from awa.contrib.django.client import get_client, import_task_modules, worker_queues
from awa.contrib.django.serve import serve
from awa.errors import AwaError
from awa.model import MAX_DURATION
from awa.observability.log_format import configure as configure_logging
from awa.worker.settings import parse_queue

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MAX_SHUTDOWN_TIMEOUT = MAX_DURATION.total_seconds()


class Command(BaseCommand):  # type: ignore[misc]
    help = (
        "Run an awa worker: the Django tasks of the awa task backend and the awa tasks "
        "registered on awa.contrib.django.get_client(), until SIGTERM or SIGINT."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="NAME[=N]",
            help="A queue to run, with its max concurrent handlers (repeatable). Default: "
            "settings.AWA['QUEUES'], else every queue the task backends and tasks declare.",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            help="Seconds running tasks get to finish after SIGTERM "
            "(default: settings.AWA['SHUTDOWN_TIMEOUT'], else 30).",
        )
        parser.add_argument(
            "--log-level",
            choices=LOG_LEVELS,
            type=str.upper,
            help="Log to stderr at this level (default: leave it to settings.LOGGING).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        settings = conf.load()
        if options["log_level"]:
            configure_logging(options["log_level"], "text")
        try:
            import_task_modules(settings)
        except ImproperlyConfigured as error:
            raise CommandError(str(error)) from None
        client = get_client()
        queues = worker_queues(client, settings)
        if options["queues"]:
            queues = _named_queues(options["queues"], queues)
        timeout = options["shutdown_timeout"]
        if timeout is None:
            timeout = settings.shutdown_timeout
        elif not 0 <= timeout <= MAX_SHUTDOWN_TIMEOUT:  # NaN too
            raise CommandError(
                f"--shutdown-timeout must be a number of seconds from 0 to "
                f"{MAX_SHUTDOWN_TIMEOUT:.0f}, got {timeout}"
            )

        def started() -> None:
            names = ", ".join(_names(queues))
            self.stdout.write(f"awa worker started: queues {names}")
            self.stdout.flush()

        try:
            asyncio.run(serve(client, queues, settings.runtime, timeout, started))
        except AwaError as error:
            raise CommandError(str(error)) from error


def _named_queues(texts: list[str], configured: Any) -> dict[str, Any]:
    """The queues --queue names, keeping the settings that settings.AWA['QUEUES'] gives
    them."""
    if isinstance(configured, Mapping):
        known = dict(configured)
    else:  # [(name, max_workers), ...]
        known = {item[0]: item[1] for item in configured or [] if isinstance(item, tuple | list)}
    queues: dict[str, Any] = {}
    for text in texts:
        try:
            name, workers = parse_queue(text)
        except AwaError as error:
            raise CommandError(str(error)) from None
        spec = known.get(name, {})
        options = dict(spec) if isinstance(spec, Mapping) else {"max_workers": spec}
        if workers is not None:
            options["max_workers"] = workers
        queues[name] = options
    return queues


def _name(item: Any) -> str:
    # (name, max_workers), or an awa.QueueConfig
    return str(item[0]) if isinstance(item, tuple | list) else str(getattr(item, "name", item))


def _names(queues: Any) -> list[str]:
    if isinstance(queues, Mapping):
        return [str(name) for name in queues]
    return [_name(item) for item in queues]
