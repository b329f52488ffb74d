"""The dead-letter queue as methods of both clients: each runs the operation of
``awa.dlq.operations`` (also in ``awa.admin``) on a pooled connection."""

from __future__ import annotations

from awa.dlq import operations as dlq
from awa.storage.calls import operation_method


class DlqMethods:
    """Mixin of both clients: the dead-letter queue."""

    list_dlq = operation_method(dlq.list_dlq)
    get_dlq_job = operation_method(dlq.get_dlq_job)
    dlq_depth = operation_method(dlq.dlq_depth)
    dlq_depth_by_queue = operation_method(dlq.dlq_depth_by_queue)
    retry_from_dlq = operation_method(dlq.retry_from_dlq)
    bulk_retry_from_dlq = operation_method(dlq.bulk_retry_from_dlq)
    move_failed_to_dlq = operation_method(dlq.move_failed_to_dlq)
    bulk_move_failed_to_dlq = operation_method(dlq.bulk_move_failed_to_dlq)
    purge_dlq_job = operation_method(dlq.purge_dlq_job)
    purge_dlq = operation_method(dlq.purge_dlq)
