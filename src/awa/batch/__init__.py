"""Durable batch operations (set priority, move queue, ... over many jobs): their types and
statements (``operations``), the clients' methods (``methods``) and the leader duty that
carries them out (``duty``). Imports the producer, lifecycle and below; no other capability."""

from awa.batch.operations import (
    BatchOperation,
    BatchOperationFilter,
    BatchOperationKind,
    BatchOperationPreview,
    BatchOperationState,
)

__all__ = [
    "BatchOperation",
    "BatchOperationFilter",
    "BatchOperationKind",
    "BatchOperationPreview",
    "BatchOperationState",
]
