"""awa: Postgres-native background jobs for Python.

Jobs are rows in Postgres, inserted inside your own transaction and run by asyncio workers.
"""

from awa import admin, bridge
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
from awa.job import Job
from awa.kinds import derive_kind
from awa.model import (
    EnqueueRequest,
    InsertOpts,
    JobRow,
    JobState,
    UniqueOpts,
)
from awa.outcomes import Cancel, RetryAfter, Snooze
from awa.transaction import SyncTransaction, Transaction
from awa.worker.config import QueueConfig, RetryPolicy, RuntimeConfig

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AwaError",
    "CallbackNotFound",
    "Cancel",
    "Client",
    "DatabaseError",
    "EnqueueRequest",
    "InsertKwargs",
    "InsertOpts",
    "Job",
    "JobRow",
    "JobState",
    "QueueConfig",
    "QueueStats",
    "RetryAfter",
    "RetryPolicy",
    "RuntimeConfig",
    "SchemaNotMigrated",
    "Snooze",
    "SyncTransaction",
    "TerminalError",
    "Transaction",
    "UniqueConflict",
    "UniqueOpts",
    "ValidationError",
    "__version__",
    "admin",
    "bridge",
    "derive_kind",
]
