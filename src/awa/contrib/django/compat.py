"""Django's task API, from wherever this installation has it.

Django 6 ships it as ``django.tasks`` (Python 3.12+); on Django 5.2 and Python 3.11 it
comes from the ``django-tasks`` backport (import name ``django_tasks``). The two spell a
few names differently (``InvalidTask`` / ``InvalidTaskError``, where ``normalize_json``
lives, and older backports' ``SUCCEEDED``); this module gives one set of names for both.
Values are typed ``Any``: Django has no bundled types.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from django.core.exceptions import ImproperlyConfigured

_LOCATIONS = (
    # (package, module of normalize_json)
    ("django.tasks", "django.utils.json"),
    ("django_tasks", "django_tasks.utils"),
)


def _import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        # Only "this package is not installed" means try the next location; a missing
        # dependency inside an installed package is a real error.
        if error.name is not None and name.startswith(error.name):
            return None
        raise


def _locate() -> tuple[str, str]:
    for package, json_module in _LOCATIONS:
        if _import(package) is not None:
            return package, json_module
    raise ImproperlyConfigured(
        "awa.contrib.django's task backend needs Django's task API: Django 6 (django.tasks) "
        "or, on Django 5.2, the backport (pip install django-tasks)"
    )


PACKAGE, _JSON_MODULE = _locate()
"""Where the task API comes from: ``django.tasks`` or ``django_tasks``."""

_base = importlib.import_module(f"{PACKAGE}.base")
_backends = importlib.import_module(f"{PACKAGE}.backends.base")
_exceptions = importlib.import_module(f"{PACKAGE}.exceptions")
_signals = importlib.import_module(f"{PACKAGE}.signals")

BaseTaskBackend: Any = _backends.BaseTaskBackend
Task: Any = _base.Task
TaskContext: Any = _base.TaskContext
TaskError: Any = _base.TaskError
TaskResult: Any = _base.TaskResult
TaskResultStatus: Any = _base.TaskResultStatus
# Django 6 and django-tasks 0.12+ say SUCCESSFUL; django-tasks before 0.12 said SUCCEEDED.
SUCCESSFUL: Any = getattr(TaskResultStatus, "SUCCESSFUL", None) or TaskResultStatus.SUCCEEDED

InvalidTask: type[Exception] = getattr(_exceptions, "InvalidTask", None) or (
    _exceptions.InvalidTaskError
)
TaskResultDoesNotExist: type[Exception] = _exceptions.TaskResultDoesNotExist

# Early versions of the API had no task_started: sending it is then skipped.
task_enqueued: Any = _signals.task_enqueued
task_started: Any = getattr(_signals, "task_started", None)
task_finished: Any = _signals.task_finished

normalize_json: Any = importlib.import_module(_JSON_MODULE).normalize_json
"""Django's conversion of args, kwargs and return values into JSON types (TypeError for
anything else)."""

task_backends: Any = importlib.import_module(PACKAGE).task_backends
"""The configured task backends (``settings.TASKS``), by alias."""
