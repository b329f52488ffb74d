"""awa: Postgres-native background jobs for Python.

Jobs are rows in Postgres, inserted inside your own transaction and run by asyncio workers.
"""

import sys

from awa import admin, bridge, callback_contract
from awa.admin import CronJob, HeldBack, OverrideChange, QueueLimits, QueueOverrides, QueueStats
from awa.batch.operations import (
    BatchOperation,
    BatchOperationFilter,
    BatchOperationKind,
    BatchOperationPreview,
    BatchOperationState,
)
from awa.callbacks import ResolveResult
from awa.client import AsyncClient, Client, SyncTransaction, Transaction
from awa.client.pacing import AsyncPacedProducer, PacedProducer, Pacer
from awa.core.kinds import derive_kind
from awa.descriptors.operations import JobKindDescriptor, QueueDescriptor
from awa.dlq.operations import DlqEntry
from awa.errors import (
    AttemptLost,
    AwaError,
    CallbackNotFound,
    CallbackWaitError,
    DatabaseError,
    QueueOverLimit,
    SchemaNotMigrated,
    StagingError,
    TerminalError,
    UniqueConflict,
    ValidationError,
)
from awa.job import Job
from awa.lifecycle.events import (
    Cancelled,
    Completed,
    Exhausted,
    JobEvent,
    Rescued,
    RescueReason,
    Retried,
    Started,
    WaitingForCallback,
)
from awa.lifecycle.followups import FollowUpError
from awa.lifecycle.staging import (
    MAX_OUTPUT_BYTES,
    MAX_STAGED_BYTES,
    MAX_STAGED_FOLLOW_UPS,
    StagedFollowUp,
)
from awa.model import (
    EnqueueRequest,
    InsertOpts,
    JobRow,
    JobState,
    UniqueOpts,
)
from awa.observability.health import HealthCheck
from awa.observability.telemetry import init_telemetry, shutdown_telemetry
from awa.outcomes import CallbackToken, Cancel, RetryAfter, Snooze, WaitForCallback
from awa.producer.backpressure import QueuePressure
from awa.producer.insert import MAX_ARGS_BYTES, MAX_METADATA_BYTES, InsertKwargs
from awa.producer.partitioned import PartitionedQueue
from awa.storage import migrations
from awa.storage.migrations import current_migration_version, migrate, migrations_range
from awa.version import __version__
from awa.worker.config import QueueConfig, RetryPolicy, RuntimeConfig
from awa.workflows.methods import WaitTimeout
from awa.workflows.operations import BatchRun, Step, Workflow, WorkflowInfo, WorkflowRun

QueueStat = QueueStats
"""The reference package's name of a ``queue_stats()`` entry (the same class)."""

# ``awa.migrations`` is the reference's callable module: importable under that name too.
sys.modules[__name__ + ".migrations"] = migrations

__all__ = [
    "MAX_ARGS_BYTES",
    "MAX_METADATA_BYTES",
    "MAX_OUTPUT_BYTES",
    "MAX_STAGED_BYTES",
    "MAX_STAGED_FOLLOW_UPS",
    "AsyncClient",
    "AsyncPacedProducer",
    "AttemptLost",
    "AwaError",
    "BatchOperation",
    "BatchOperationFilter",
    "BatchOperationKind",
    "BatchOperationPreview",
    "BatchOperationState",
    "BatchRun",
    "CallbackNotFound",
    "CallbackToken",
    "CallbackWaitError",
    "Cancel",
    "Cancelled",
    "Client",
    "Completed",
    "CronJob",
    "DatabaseError",
    "DlqEntry",
    "EnqueueRequest",
    "Exhausted",
    "FollowUpError",
    "HealthCheck",
    "HeldBack",
    "InsertKwargs",
    "InsertOpts",
    "Job",
    "JobEvent",
    "JobKindDescriptor",
    "JobRow",
    "JobState",
    "OverrideChange",
    "PacedProducer",
    "Pacer",
    "PartitionedQueue",
    "QueueConfig",
    "QueueDescriptor",
    "QueueLimits",
    "QueueOverLimit",
    "QueueOverrides",
    "QueuePressure",
    "QueueStat",
    "QueueStats",
    "RescueReason",
    "Rescued",
    "ResolveResult",
    "Retried",
    "RetryAfter",
    "RetryPolicy",
    "RuntimeConfig",
    "SchemaNotMigrated",
    "Snooze",
    "StagedFollowUp",
    "StagingError",
    "Started",
    "Step",
    "SyncTransaction",
    "TerminalError",
    "Transaction",
    "UniqueConflict",
    "UniqueOpts",
    "ValidationError",
    "WaitForCallback",
    "WaitTimeout",
    "WaitingForCallback",
    "Workflow",
    "WorkflowInfo",
    "WorkflowRun",
    "__version__",
    "admin",
    "bridge",
    "callback_contract",
    "current_migration_version",
    "derive_kind",
    "init_telemetry",
    "migrate",
    "migrations",
    "migrations_range",
    "shutdown_telemetry",
]
