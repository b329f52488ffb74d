"""The Django app: ``INSTALLED_APPS += ["awa.contrib.django"]``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured


class AwaConfig(AppConfig):  # type: ignore[misc]
    """Adds ``manage.py awa_worker`` and ``awa_migrate``, and checks ``settings.AWA`` with
    the system checks (``manage.py check``)."""

    name = "awa.contrib.django"
    label = "awa"
    verbose_name = "awa"

    def ready(self) -> None:
        checks.register(check_settings)


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """System check: settings.AWA is valid."""
    from awa.contrib.django import conf

    try:
        conf.load()
    except ImproperlyConfigured as error:
        return [checks.Error(str(error), id="awa.E001")]
    return []
