"""Django integration: ``INSTALLED_APPS += ["awa.contrib.django"]``.

- ``AwaTaskBackend``: Django's task API (``django.tasks``, or the ``django-tasks``
  backport) on awa: ``TASKS = {"default": {"BACKEND": "awa.contrib.django.AwaTaskBackend"}}``.
- ``get_client()``: the process's ``awa.AsyncClient`` on the jobs' database, for
  registering awa tasks that ``manage.py awa_worker`` runs beside the Django tasks.
- ``manage.py awa_worker`` and ``manage.py awa_migrate``; ``settings.AWA`` configures them
  (``awa.contrib.django.conf``).

See docs/django.md. Names are imported on first use, so that importing the package needs
neither configured settings nor the task API. Needs the ``django`` extra
(``pip install 'awa-py[django]'``); without it, importing the package raises
``awa.errors.MissingExtra`` saying so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from awa.core.extras import require_extra

require_extra("django", "awa.contrib.django")

from awa.contrib.django.mapping import KIND, awa_priority  # noqa: E402 - after the check

if TYPE_CHECKING:
    from awa.contrib.django.backend import AwaTaskBackend
    from awa.contrib.django.client import get_client

__all__ = ["KIND", "AwaTaskBackend", "awa_priority", "get_client"]


def __getattr__(name: str) -> Any:
    if name == "AwaTaskBackend":
        from awa.contrib.django.backend import AwaTaskBackend

        return AwaTaskBackend
    if name == "get_client":
        from awa.contrib.django.client import get_client

        return get_client
    raise AttributeError(f"module 'awa.contrib.django' has no attribute {name!r}")
