"""Applying the numbered migrations of ``awa/sql/migrations``.

A run is one transaction holding an advisory lock: concurrent migrators wait for each other,
and each migration is recorded in ``awa.schema_migrations`` with the schema change it made,
so a run is all-or-nothing and running it again is a no-op.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Generator
from typing import Any

import psycopg

from awa.errors import SchemaNotMigrated
from awa.sql import Migration, current_version, migrations, query
from awa.storage.db import Flow, Statement, operation, resolve_database_url, translate_errors


def _pending(applied: set[int]) -> list[Migration]:
    return [migration for migration in migrations() if migration.version not in applied]


def _versions(rows: list[tuple[Any, ...]]) -> set[int]:
    return {row[0] for row in rows}


def _nothing(rows: list[Any]) -> None:
    return None


def migration_flow() -> Flow[list[int]]:
    """Apply pending migrations (run it in one transaction: it takes the migration lock);
    returns the versions applied by this call."""
    yield Statement(query("migrate_lock"), None, _nothing)
    yield Statement(query("migrate_bootstrap"), None, _nothing)
    applied = yield Statement(query("migrate_applied_versions"), None, _versions, tuples=True)
    todo = _pending(applied)
    for migration in todo:
        yield Statement(migration.sql, None, _nothing)
        params = {"version": migration.version, "name": migration.name}
        yield Statement(query("migrate_record"), params, _nothing)
    return [migration.version for migration in todo]


# Applying the migrations on a connection (``migrate_async(conn)`` awaited on an asyncio one,
# ``migrate_sync(conn)`` on a blocking one): the same Operation under the callers' two names.
migrate_async = migrate_sync = operation(migration_flow)


def migration_script() -> str:
    """The whole schema as one SQL script, for review or for applying by other means."""
    parts = [
        f"-- awa schema, migrations 1 to {current_version()}",
        "BEGIN;",
        query("migrate_lock") + ";",
        query("migrate_bootstrap") + ";",
    ]
    for migration in migrations():
        parts.append(f"-- migration {migration.version:04d}_{migration.name}")
        parts.append(migration.sql.rstrip())
        parts.append(
            "INSERT INTO awa.schema_migrations (version, name) VALUES "
            f"({migration.version}, '{migration.name}') ON CONFLICT DO NOTHING;"
        )
    parts.append("COMMIT;")
    return "\n".join(parts) + "\n"


def schema_version_flow() -> Flow[int | None]:
    """The newest migration applied to this database (None: never migrated)."""
    present = yield Statement(query("schema_migrations_exists"), None, _first_value)
    if not present:
        return None
    version: int | None = yield Statement(query("schema_version"), None, _first_value)
    return version


def _first_value(rows: list[dict[str, Any]]) -> Any:
    return next(iter(rows[0].values()))


def check_version(found: int | None) -> None:
    """Raise SchemaNotMigrated unless the schema is at this package's version."""
    expected = current_version()
    if found is None:
        raise SchemaNotMigrated(
            "the awa schema does not exist in this database; run `awa migrate` "
            "or `await client.migrate()`"
        )
    if found < expected:
        raise SchemaNotMigrated(
            f"the awa schema is at version {found}, this package needs {expected}; "
            "run `awa migrate` or `await client.migrate()`"
        )
    if found > expected:
        raise SchemaNotMigrated(
            f"the awa schema is at version {found}, newer than this package knows "
            f"({expected}); upgrade awa-py"
        )


# The reference package's module-level functions ----------------------------------------


def migration_list() -> list[tuple[int, str, str]]:
    """Every migration of this version as ``(version, description, sql)``."""
    return [(m.version, m.name.replace("_", " "), m.sql) for m in migrations()]


def migrations_range(from_version: int, to_version: int) -> list[tuple[int, str, str]]:
    """The migrations after ``from_version`` up to ``to_version`` included."""
    return [entry for entry in migration_list() if from_version < entry[0] <= to_version]


def current_migration_version() -> int:
    """The newest migration this version of awa ships."""
    return current_version()


class AppliedMigrations(list[int]):
    """The versions ``migrate()`` applied; also awaitable (the reference's ``awa.migrate``
    is awaited), the work being done already."""

    def __await__(self) -> Generator[Any, None, AppliedMigrations]:
        return self
        yield  # pragma: no cover - makes this a generator


def migrate(database_url: str | None = None) -> AppliedMigrations:
    """Apply awa's schema to the database (``DATABASE_URL`` when None): blocking, and
    awaitable for programs written as ``await awa.migrate(url)``. In async code prefer
    ``await client.migrate()``, which does not block the event loop."""
    url = resolve_database_url(database_url)
    with translate_errors(), psycopg.connect(url, autocommit=True) as conn:
        return AppliedMigrations(migrate_sync(conn))


class _CallableModule(types.ModuleType):
    """``awa.migrations()`` lists the migrations as the reference's function does, while
    ``awa.migrations`` stays this module for ``from awa.migrations import ...``."""

    def __call__(self) -> list[tuple[int, str, str]]:
        return migration_list()


sys.modules[__name__].__class__ = _CallableModule
