"""The names of the reference package's compiled module (``awa._awa``), for programs and
tools that import from it (``from awa._awa import derive_kind``). Each is awa's own object:
the same as ``awa.<name>``, or its ``awa.callbacks.contract`` counterpart for the callback
contract's raw names. The reference's raw client (``_awa.Client``, ``awa.RawClient``) has no
counterpart here: use ``awa.AsyncClient`` or ``awa.Client``.
"""

from __future__ import annotations

from awa.admin import QueueStats as QueueStat
from awa.admin import RetryFailedResult
from awa.callbacks import ResolveResult
from awa.callbacks.contract import (
    DEFAULT_HEARTBEAT_TIMEOUT_SECS as CALLBACK_DEFAULT_HEARTBEAT_TIMEOUT_SECS,
)
from awa.callbacks.contract import DEFAULT_PATH_PREFIX as CALLBACK_DEFAULT_PATH_PREFIX
from awa.callbacks.contract import SIGNATURE_HEADER as CALLBACK_SIGNATURE_HEADER
from awa.callbacks.contract import build_callback_url
from awa.callbacks.contract import sign as sign_callback
from awa.callbacks.contract import verify as verify_callback
from awa.client.transaction import SyncTransaction, Transaction
from awa.core.kinds import derive_kind
from awa.dlq.operations import DlqEntry
from awa.errors import (
    AwaError,
    CallbackNotFound,
    DatabaseError,
    SchemaNotMigrated,
    TerminalError,
    UniqueConflict,
    ValidationError,
)
from awa.job import Job
from awa.model import JobState
from awa.observability.health import HealthCheck
from awa.observability.telemetry import init_telemetry, shutdown_telemetry
from awa.outcomes import CallbackToken, Cancel, RetryAfter, Snooze, WaitForCallback
from awa.producer.partitioned import PartitionedQueue
from awa.storage.migrations import (
    current_migration_version,
    migrate,
    migrations_range,
)
from awa.storage.migrations import (
    migration_list as migrations,
)

__all__ = [
    "CALLBACK_DEFAULT_HEARTBEAT_TIMEOUT_SECS",
    "CALLBACK_DEFAULT_PATH_PREFIX",
    "CALLBACK_SIGNATURE_HEADER",
    "AwaError",
    "CallbackNotFound",
    "CallbackToken",
    "Cancel",
    "DatabaseError",
    "DlqEntry",
    "HealthCheck",
    "Job",
    "JobState",
    "PartitionedQueue",
    "QueueStat",
    "ResolveResult",
    "RetryAfter",
    "RetryFailedResult",
    "SchemaNotMigrated",
    "Snooze",
    "SyncTransaction",
    "TerminalError",
    "Transaction",
    "UniqueConflict",
    "ValidationError",
    "WaitForCallback",
    "build_callback_url",
    "current_migration_version",
    "derive_kind",
    "init_telemetry",
    "migrate",
    "migrations",
    "migrations_range",
    "shutdown_telemetry",
    "sign_callback",
    "verify_callback",
]
