"""The reference package's storage-engine calls and ``flush_admin_metadata`` as methods of
both clients. What they report and do is ``awa.storage.engine``'s (awa has one engine)."""

from __future__ import annotations

from awa.errors import AwaError
from awa.sql import query
from awa.storage import engine
from awa.storage.calls import client_method
from awa.storage.db import Call, Flow, Statement
from awa.storage.engine import (
    DEFAULT_QUEUE_STORAGE_LEASE_SLOT_COUNT,
    DEFAULT_QUEUE_STORAGE_QUEUE_SLOT_COUNT,
    DEFAULT_QUEUE_STORAGE_SCHEMA,
)
from awa.storage.migrations import migration_flow


def _reset() -> Flow[None]:
    """Drop the schema ``awa`` and migrate again, in one transaction."""
    yield Statement(query("storage_drop"), None, lambda rows: None)
    yield from migration_flow()


class StorageMethods:
    """Mixin of both clients: storage status and upkeep (see ``awa.storage.engine``)."""

    @client_method
    def install_queue_storage(
        self,
        *,
        schema: str = DEFAULT_QUEUE_STORAGE_SCHEMA,
        queue_slot_count: int = DEFAULT_QUEUE_STORAGE_QUEUE_SLOT_COUNT,
        lease_slot_count: int = DEFAULT_QUEUE_STORAGE_LEASE_SLOT_COUNT,
        reset: bool = False,
    ) -> Call[None]:
        """The reference's install: here the migrations built the storage already, so this
        checks its arguments and that the schema is migrated. ``reset=True`` empties it as
        the reference does: the schema ``awa`` is dropped (every job, schedule and setting)
        and migrated again, in one transaction. Not while this client's worker runs."""
        if getattr(self, "_runtime", None) is not None:
            raise AwaError(engine.RUNNING_ERROR)
        engine.check_storage_options(schema, queue_slot_count, lease_slot_count, reset)
        return _reset() if reset else engine.check_installed.build()

    @client_method
    def prepare_queue_storage_schema(
        self,
        *,
        schema: str = DEFAULT_QUEUE_STORAGE_SCHEMA,
        queue_slot_count: int = DEFAULT_QUEUE_STORAGE_QUEUE_SLOT_COUNT,
        lease_slot_count: int = DEFAULT_QUEUE_STORAGE_LEASE_SLOT_COUNT,
    ) -> Call[None]:
        """The reference's prepare: checks its arguments and that the schema is migrated
        (the migrations create the storage's tables; there is nothing else to prepare)."""
        engine.check_storage_options(schema, queue_slot_count, lease_slot_count)
        return engine.check_installed.build()

    @client_method
    def migrate(self) -> Call[list[int]]:
        """Create or upgrade the awa schema; returns the migration versions applied."""
        return migration_flow()


__all__ = ["StorageMethods"]
