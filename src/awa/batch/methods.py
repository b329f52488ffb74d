"""Durable batch operations as methods of both clients (see ``awa.batch.operations`` for
what the operations do and the errors they raise)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from awa.batch import operations as ops
from awa.batch.operations import BatchOperation, BatchOperationFilter, BatchOperationPreview
from awa.storage.calls import client_method
from awa.storage.db import Call

Filter = BatchOperationFilter | Mapping[str, Any] | None


def _move_spec(queue: str, priority: int | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"queue": queue}
    if priority is not None:
        spec["priority"] = priority
    return spec


class BatchMethods:
    """Mixin of both clients: the batch operations of one kind (the generic ones are the
    operations of ``awa.batch.operations``, bound in ``awa.client.methods``)."""

    @client_method
    def preview_set_priority(
        self, priority: int, *, filter: Filter = None
    ) -> Call[BatchOperationPreview]:
        """Preview giving the queued jobs the filter matches ``priority``."""
        spec = {"priority": priority}
        return ops.preview_batch_operation.build("set_priority", spec=spec, filter=filter)

    @client_method
    def set_priority(
        self,
        priority: int,
        *,
        filter: Filter = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ) -> Call[BatchOperation]:
        """Submit an operation giving the queued jobs the filter matches ``priority``."""
        return ops.submit_batch_operation.build(
            "set_priority",
            spec={"priority": priority},
            filter=filter,
            submitted_by=submitted_by,
            allow_all=allow_all,
        )

    @client_method
    def preview_move_queue(
        self, queue: str, *, priority: int | None = None, filter: Filter = None
    ) -> Call[BatchOperationPreview]:
        """Preview moving the queued jobs the filter matches to ``queue``."""
        spec = _move_spec(queue, priority)
        return ops.preview_batch_operation.build("move_queue", spec=spec, filter=filter)

    @client_method
    def move_queue(
        self,
        queue: str,
        *,
        priority: int | None = None,
        filter: Filter = None,
        submitted_by: str | None = None,
        allow_all: bool = False,
    ) -> Call[BatchOperation]:
        """Submit an operation moving the queued jobs the filter matches to ``queue`` (and
        giving them ``priority``, if set)."""
        return ops.submit_batch_operation.build(
            "move_queue",
            spec=_move_spec(queue, priority),
            filter=filter,
            submitted_by=submitted_by,
            allow_all=allow_all,
        )
