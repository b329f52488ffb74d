"""The reference package's storage-engine calls and ``flush_admin_metadata`` as client
methods: ``AsyncStorageMethods`` is mixed into ``AsyncClient`` (coroutines),
``StorageMethods`` into the blocking ``Client``. What they report and do is ``awa.storage.engine``'s
(awa has one engine) and ``awa.storage.flush_admin_metadata``."""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg

from awa.errors import AwaError
from awa.sql import query
from awa.storage import engine as storage
from awa.storage.db import translate_errors
from awa.storage.engine import (
    DEFAULT_QUEUE_STORAGE_LEASE_SLOT_COUNT,
    DEFAULT_QUEUE_STORAGE_QUEUE_SLOT_COUNT,
    DEFAULT_QUEUE_STORAGE_SCHEMA,
)
from awa.storage.migrations import migrate_async, migrate_sync


def _check_idle(client: object) -> None:
    if getattr(client, "_runtime", None) is not None:
        raise AwaError(storage.RUNNING_ERROR)


class AsyncStorageMethods:
    """Mixin of AsyncClient: storage status and upkeep (see ``awa.storage.engine``)."""

    def connection(self) -> contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        raise NotImplementedError  # provided by AsyncClient

    async def storage_status(self) -> str:
        """The storage engine, as pretty JSON in the reference's shape: awa's one engine,
        active, in the schema ``awa``, at the schema's migration version."""
        async with self.connection() as conn:
            return await storage.storage_status(conn)

    async def install_queue_storage(
        self,
        *,
        schema: str = DEFAULT_QUEUE_STORAGE_SCHEMA,
        queue_slot_count: int = DEFAULT_QUEUE_STORAGE_QUEUE_SLOT_COUNT,
        lease_slot_count: int = DEFAULT_QUEUE_STORAGE_LEASE_SLOT_COUNT,
        reset: bool = False,
    ) -> None:
        """The reference's install: here the migrations built the storage already, so this
        checks its arguments and that the schema is migrated. ``reset=True`` empties it as
        the reference does: the schema ``awa`` is dropped (every job, schedule and setting)
        and migrated again, in one transaction. Not while this client's worker runs."""
        _check_idle(self)
        storage.check_storage_options(schema, queue_slot_count, lease_slot_count, reset)
        async with self.connection() as conn:
            if not reset:
                await storage.check_installed(conn)
                return
            with translate_errors():
                async with conn.transaction():
                    await conn.execute(query("storage_drop"))
                    await migrate_async(conn)

    async def prepare_queue_storage_schema(
        self,
        *,
        schema: str = DEFAULT_QUEUE_STORAGE_SCHEMA,
        queue_slot_count: int = DEFAULT_QUEUE_STORAGE_QUEUE_SLOT_COUNT,
        lease_slot_count: int = DEFAULT_QUEUE_STORAGE_LEASE_SLOT_COUNT,
    ) -> None:
        """The reference's prepare: checks its arguments and that the schema is migrated
        (the migrations create the storage's tables; there is nothing else to prepare)."""
        storage.check_storage_options(schema, queue_slot_count, lease_slot_count)
        async with self.connection() as conn:
            await storage.check_installed(conn)

    async def flush_admin_metadata(self) -> None:
        """Bring the maintenance leader's admin caches up to date now (the count rows of
        completed jobs, the queue samples behind the queue gauges and the UI), for when no
        leader runs; ``queue_stats()`` itself always counts live."""
        async with self.connection() as conn:
            await storage.flush_admin_metadata(conn)


class StorageMethods:
    """Mixin of the blocking Client: the same as ``AsyncStorageMethods``."""

    def connection(self) -> contextlib.AbstractContextManager[psycopg.Connection[Any]]:
        raise NotImplementedError  # provided by Client

    def storage_status(self) -> str:
        with self.connection() as conn:
            return storage.storage_status(conn)

    def install_queue_storage(
        self,
        *,
        schema: str = DEFAULT_QUEUE_STORAGE_SCHEMA,
        queue_slot_count: int = DEFAULT_QUEUE_STORAGE_QUEUE_SLOT_COUNT,
        lease_slot_count: int = DEFAULT_QUEUE_STORAGE_LEASE_SLOT_COUNT,
        reset: bool = False,
    ) -> None:
        storage.check_storage_options(schema, queue_slot_count, lease_slot_count, reset)
        with self.connection() as conn:
            if not reset:
                storage.check_installed(conn)
                return
            with translate_errors(), conn.transaction():
                conn.execute(query("storage_drop"))
                migrate_sync(conn)

    def prepare_queue_storage_schema(
        self,
        *,
        schema: str = DEFAULT_QUEUE_STORAGE_SCHEMA,
        queue_slot_count: int = DEFAULT_QUEUE_STORAGE_QUEUE_SLOT_COUNT,
        lease_slot_count: int = DEFAULT_QUEUE_STORAGE_LEASE_SLOT_COUNT,
    ) -> None:
        storage.check_storage_options(schema, queue_slot_count, lease_slot_count)
        with self.connection() as conn:
            storage.check_installed(conn)

    def flush_admin_metadata(self) -> None:
        with self.connection() as conn:
            storage.flush_admin_metadata(conn)
