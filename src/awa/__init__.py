"""awa: Postgres-native background jobs for Python.

Jobs are rows in Postgres, inserted inside your own transaction and run by asyncio workers.
"""

from awa import admin
from awa.admin import QueueStats
from awa.client import AsyncClient, Client
from awa.errors import (
    AwaError,
    CallbackNotFound,
    DatabaseError,
    SchemaNotMigrated,
    TerminalError,
    UniqueConflict,
    ValidationError,
)
from awa.insert import InsertKwargs
from awa.kinds import derive_kind
from awa.model import (
    EnqueueRequest,
    InsertOpts,
    JobRow,
    JobState,
    UniqueOpts,
)
from awa.transaction import SyncTransaction, Transaction

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AwaError",
    "CallbackNotFound",
    "Client",
    "DatabaseError",
    "EnqueueRequest",
    "InsertKwargs",
    "InsertOpts",
    "JobRow",
    "JobState",
    "QueueStats",
    "SchemaNotMigrated",
    "SyncTransaction",
    "TerminalError",
    "Transaction",
    "UniqueConflict",
    "UniqueOpts",
    "ValidationError",
    "__version__",
    "admin",
    "derive_kind",
]
