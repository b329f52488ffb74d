"""``manage.py awa_migrate``: create or upgrade the awa schema in the jobs' database."""

from __future__ import annotations

from typing import Any

import psycopg
from django.core.management.base import BaseCommand, CommandError

from awa.contrib.django import conf
from awa.errors import AwaError
from awa.storage.migrations import migrate_sync, migration_script


class Command(BaseCommand):  # type: ignore[misc]
    help = (
        "Create or upgrade the awa schema in the jobs' database (settings.AWA); safe to "
        "run on every deploy."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--sql",
            action="store_true",
            help="Print the schema as one SQL script instead of applying it.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["sql"]:
            self.stdout.write(migration_script(), ending="")
            return
        settings = conf.load()
        try:
            with psycopg.connect(settings.url, autocommit=True) as conn:
                applied = migrate_sync(conn)
        except (psycopg.Error, AwaError) as error:
            raise CommandError(f"awa_migrate failed: {error}") from error
        if applied:
            versions = ", ".join(str(version) for version in applied)
            self.stdout.write(f"applied awa migrations {versions}")
        else:
            self.stdout.write("the awa schema is up to date")
