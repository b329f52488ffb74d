"""Storage: connections and running statements (``db``), the schema's migrations, the embedded
server, the storage engine's report and upkeep (``engine``) and the clients' storage calls
(``methods``). Imports the core only.

The reference package's ``awa.storage`` constants are re-exported here."""

from awa.storage.engine import (
    DEFAULT_QUEUE_STORAGE_CLAIM_SLOT_COUNT,
    DEFAULT_QUEUE_STORAGE_LEASE_SLOT_COUNT,
    DEFAULT_QUEUE_STORAGE_QUEUE_SLOT_COUNT,
    DEFAULT_QUEUE_STORAGE_QUEUE_STRIPE_COUNT,
    DEFAULT_QUEUE_STORAGE_SCHEMA,
)

__all__ = [
    "DEFAULT_QUEUE_STORAGE_CLAIM_SLOT_COUNT",
    "DEFAULT_QUEUE_STORAGE_LEASE_SLOT_COUNT",
    "DEFAULT_QUEUE_STORAGE_QUEUE_SLOT_COUNT",
    "DEFAULT_QUEUE_STORAGE_QUEUE_STRIPE_COUNT",
    "DEFAULT_QUEUE_STORAGE_SCHEMA",
]
