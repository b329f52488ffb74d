"""The Django app: ``INSTALLED_APPS += ["awa.contrib.django"]``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db.models.signals import post_migrate


class AwaConfig(AppConfig):  # type: ignore[misc]
    """Adds ``manage.py awa_worker`` and ``awa_migrate``, applies awa's schema after
    ``manage.py migrate`` on the jobs' database, and checks ``settings.AWA`` with the system
    checks (``manage.py check``)."""

    name = "awa.contrib.django"
    label = "awa"
    verbose_name = "awa"

    def ready(self) -> None:
        checks.register(check_settings)
        post_migrate.connect(migrate_schema, sender=self, dispatch_uid="awa.migrate_schema")


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """System check: settings.AWA is valid (awa.E001) and every module TASK_MODULES names
    can be imported (awa.E002, one error per module, naming it)."""
    from awa.contrib.django import conf

    try:
        settings = conf.load()
    except ImproperlyConfigured as error:
        return [checks.Error(str(error), id="awa.E001")]
    return [
        checks.Error(
            f"settings.AWA['TASK_MODULES'] names a module that cannot be imported: {problem}",
            hint="Fix the module name, or add the module's directory to the import path.",
            id="awa.E002",
        )
        for problem in conf.missing_task_modules(settings.task_modules)
    ]


def migrate_schema(using: str, verbosity: int = 1, **kwargs: Any) -> None:
    """After ``migrate`` on the jobs' Django database, apply awa's migrations there too (so
    that a test run's database has the schema). Skipped with ``MIGRATE: False`` and when
    the jobs live at ``URL`` (``manage.py awa_migrate`` covers those)."""
    import psycopg

    from awa.contrib.django import conf
    from awa.storage.migrations import migrate_sync

    settings = conf.load()
    if not settings.migrate or settings.database != using:
        return
    with psycopg.connect(conf.conninfo(using), autocommit=True) as conn:
        applied = migrate_sync(conn)
    if applied and verbosity >= 1:
        stdout = kwargs.get("stdout")
        line = f"Applied awa migrations {', '.join(str(version) for version in applied)}\n"
        if stdout is not None:
            stdout.write(line)
        else:
            print(line, end="")
