"""The methods both clients share, each written once (``awa.storage.calls``): producing,
operating jobs and queues, the health check, task routes and defaults, and the capabilities'
methods. ``AsyncClient`` awaits them, ``Client`` blocks."""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, Unpack

from awa import admin, callbacks
from awa.batch import operations as batch
from awa.batch.methods import BatchMethods
from awa.core.arguments import check_client_options, check_flag, check_seconds
from awa.descriptors import operations as descriptors
from awa.dlq import operations as dlq
from awa.errors import AwaError, DatabaseError, SchemaNotMigrated
from awa.model import JobRow, UniqueOpts, check_name
from awa.observability.health import (
    DEFAULT_UNSERVED_AFTER,
    HEALTH_CHECK_TIMEOUT,
    HealthCheck,
    RuntimeHealth,
    health_flow,
    schema_missing,
    unreachable,
)
from awa.observability.tracing import describe_insert, producing
from awa.periodic import operations as periodic
from awa.producer import backpressure
from awa.producer.backpressure import DepthLimits, Policy, QueuePressure, guarded
from awa.producer.copy import copy_flow, with_per_job_opts
from awa.producer.insert import (
    MAX_ARGS_BYTES,
    MAX_METADATA_BYTES,
    InsertKwargs,
    InsertRules,
    TaskDefaults,
    prepare_many,
    split_kwargs,
)
from awa.producer.statements import insert_call
from awa.storage import engine
from awa.storage.calls import Recovering, Within, client_method, operation_method
from awa.storage.db import DEFAULT_APPLICATION_NAME, Call, Flow
from awa.storage.methods import StorageMethods
from awa.worker.config import RetryPolicy
from awa.worker.registry import TaskRegistry
from awa.workflows.methods import WorkflowMethods

H = TypeVar("H", bound=Callable[..., Any])


class TaskMethods:
    """Task registration: the routes (kind -> queue) and per-task defaults every insert of
    the client follows; on ``AsyncClient`` the handlers its worker runs too."""

    _tasks: TaskRegistry
    _insert_rules: InsertRules

    @property
    def insert_rules(self) -> InsertRules:
        """How this client inserts: task routes, per-task defaults, size limits (pass the
        client to ``awa.bridge.insert_job(..., client=client)`` to insert the same way)."""
        return self._insert_rules

    def task(
        self,
        args_type: type[Any] | None,
        *,
        kind: str | None = None,
        queue: str = "default",
        priority: int | None = None,
        max_attempts: int | None = None,
        unique_opts: UniqueOpts | Mapping[str, Any] | None = None,
        deadline_duration: float | dt.timedelta | None = None,
        retry: RetryPolicy | None = None,
    ) -> Callable[[H], H]:
        """Register a handler for jobs of ``args_type`` (kind derived from its name unless
        given). Use as a decorator; ``async def`` handlers run on the event loop, plain
        ``def`` handlers in a thread pool. The handler receives an ``awa.Job``.

        ``queue``, ``priority``, ``max_attempts``, ``unique_opts`` and ``deadline_duration``
        are the defaults of this kind's inserts through this client (follow-ups and staged
        ones included): an insert's own options win. ``retry`` (an ``awa.RetryPolicy``)
        replaces the queue's backoff for this kind's failed attempts. The blocking client
        runs no handlers: there a task gives its kind's routes and defaults only."""
        defaults = TaskDefaults(
            priority, max_attempts, UniqueOpts.coerce(unique_opts), deadline_duration
        )

        def register(handler: H) -> H:
            if getattr(self, "_runtime", None) is not None:
                raise AwaError("register tasks before start()")
            self._tasks.add(
                args_type, handler, kind=kind, queue=queue, defaults=defaults, retry=retry
            )
            return handler

        return register

    def worker(
        self, args_type: type[Any] | None, *, kind: str | None = None, queue: str = "default"
    ) -> Callable[[H], H]:
        """Deprecated spelling of ``task`` (the reference package's former name)."""
        warnings.warn(
            "client.worker() is deprecated, use client.task() instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.task(args_type, kind=kind, queue=queue)


def _many(
    jobs: Iterable[Any], kind: str | None, opts: Any, rules: InsertRules
) -> Callable[[Any], Call[list[JobRow]]]:
    def build(span: Any) -> Call[list[JobRow]]:
        prepared = prepare_many(jobs, kind=kind, opts=opts, rules=rules)
        describe_insert(span, prepared)
        return guarded(rules, insert_call(prepared), [job.queue for job in prepared])

    return build


class ProducerMethods:
    """Inserting several jobs (one job: each client's own ``insert``)."""

    _insert_rules: InsertRules

    @client_method
    def insert_many(
        self, jobs: Iterable[Any], **kwargs: Unpack[InsertKwargs]
    ) -> Within[Any, list[JobRow]]:
        """Insert several jobs atomically. Items are args, or ``awa.EnqueueRequest`` to
        override the shared keyword options for one job."""
        kind, opts = split_kwargs("insert_many", kwargs)
        return Within(producing, _many(jobs, kind, opts, self._insert_rules))

    @client_method
    def insert_many_copy(
        self,
        jobs: Iterable[Any],
        *,
        opts: Sequence[Mapping[str, Any] | None] | None = None,
        **kwargs: Unpack[InsertKwargs],
    ) -> Call[list[JobRow]]:
        """Bulk insert with COPY (atomic); same arguments as ``insert_many``. ``opts``: one
        entry per job, None or a dict of ``queue`` / ``ordering_key`` for that job (the
        reference package's form; an ``awa.EnqueueRequest`` per job does the same and more)."""
        jobs = with_per_job_opts(jobs, opts)
        kind, opts_ = split_kwargs("insert_many_copy", kwargs)
        rules = self._insert_rules
        return guarded(rules, copy_flow(jobs, kind=kind, opts=opts_, rules=rules))

    @client_method
    def set_queue_depth_limit(
        self, queue: str, max_depth: int, *, policy: Policy = "signal"
    ) -> Flow[None]:
        """Limit ``queue``'s depth (see ``awa.admin.set_queue_depth_limit``); this client
        acts on it from its next insert, other clients within a second."""
        statement = backpressure.set_queue_depth_limit.build(queue, max_depth, policy=policy)
        return self._depth_limits.changing(statement)

    @client_method
    def clear_queue_depth_limit(self, queue: str) -> Flow[bool]:
        """Remove ``queue``'s depth limit; False when it had none."""
        statement = backpressure.clear_queue_depth_limit.build(queue)
        return self._depth_limits.changing(statement)

    @property
    def _depth_limits(self) -> DepthLimits:
        limits = self._insert_rules.depth_limits
        assert limits is not None  # every client has one
        return limits

    @client_method
    def queue_pressure(self, queue: str) -> Flow[QueuePressure]:
        """``queue``'s depth against its depth limit as this client sees it (``.over``: at
        or over the limit; see docs/backpressure.md for how fresh the depth is)."""
        return self._depth_limits.pressure_flow(check_name("queue", queue))


class OperatorMethods:
    """The operations (statements on any connection, also ``awa.admin``'s) that both clients
    run on a pooled connection, and the health check."""

    # Jobs and queues.
    get_job = operation_method(admin.get_job)
    list_jobs = operation_method(admin.list_jobs)
    cancel = operation_method(admin.cancel)
    cancel_by_unique_key = operation_method(admin.cancel_by_unique_key)
    retry = operation_method(admin.retry)
    pause_queue = operation_method(admin.pause_queue)
    resume_queue = operation_method(admin.resume_queue)
    drain_queue = operation_method(admin.drain_queue)
    queue_stats = operation_method(admin.queue_stats)
    # Live queue overrides.
    set_queue_overrides = operation_method(admin.set_queue_overrides)
    clear_queue_overrides = operation_method(admin.clear_queue_overrides)
    list_queue_overrides = operation_method(admin.list_queue_overrides)
    queue_override_log = operation_method(admin.queue_override_log)
    list_queue_depth_limits = operation_method(backpressure.list_queue_depth_limits)
    # Periodic jobs (the reference's "cron" names).
    list_cron_jobs = operation_method(periodic.list_cron_jobs)
    pause_cron_job = operation_method(periodic.pause_cron_job)
    resume_cron_job = operation_method(periodic.resume_cron_job)
    trigger_cron_job = operation_method(periodic.trigger_cron_job)
    delete_cron_job = operation_method(periodic.delete_cron_job)
    # The dead-letter queue.
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
    # Durable batch operations.
    preview_batch_operation = operation_method(batch.preview_batch_operation)
    submit_batch_operation = operation_method(batch.submit_batch_operation)
    list_batch_operations = operation_method(batch.list_batch_operations)
    get_batch_operation = operation_method(batch.get_batch_operation)
    cancel_batch_operation = operation_method(batch.cancel_batch_operation)
    purge_batch_operations = operation_method(batch.purge_batch_operations)
    # Descriptors, storage.
    list_queue_descriptors = operation_method(descriptors.list_queue_descriptors)
    list_job_kind_descriptors = operation_method(descriptors.list_job_kind_descriptors)
    storage_status = operation_method(engine.storage_status)
    flush_admin_metadata = operation_method(engine.flush_admin_metadata)

    @client_method
    def retry_failed(
        self, *, kind: str | None = None, queue: str | None = None
    ) -> Call[admin.RetryFailedResult]:
        """Every failed job of a kind and/or queue back to available (see
        ``awa.admin.retry_failed``)."""
        return admin.retry_failed.build(kind=kind, queue=queue)

    @client_method
    def discard_failed(self, kind: str) -> Call[int]:
        """Delete every failed job of ``kind``; returns how many."""
        return admin.discard_failed.build(kind)

    def _runtime_health(self) -> RuntimeHealth | None:
        return None  # the asyncio client's runtime adds its part

    @client_method
    def health_check(
        self, *, unserved_after: float = DEFAULT_UNSERVED_AFTER, queues: bool = True
    ) -> Recovering[HealthCheck]:
        """Database reachable and migrated, a maintenance leader somewhere, this worker's
        listener and heartbeat alive, the live workers, and each queue's backlog and lag;
        ``status`` is ``degraded`` when a queue's available jobs have waited more than
        ``unserved_after`` seconds while no live worker runs it. ``queues=False`` skips the
        per-queue counts (for frequent probes on a large job table)."""
        check_seconds("unserved_after", unserved_after)
        check_flag("queues", queues)
        runtime = self._runtime_health()

        def recover(error: AwaError) -> HealthCheck:
            if isinstance(error, SchemaNotMigrated):
                return schema_missing(runtime)
            if isinstance(error, DatabaseError):
                return unreachable(error, runtime)
            raise error

        # A short wait for a connection: while the database is down the pool would
        # otherwise hold the check for its whole timeout (30 s).
        flow = health_flow(runtime, unserved_after, queues=queues)
        return Recovering(flow, recover, HEALTH_CHECK_TIMEOUT)


class CallbackMethods:
    """The blocking client's answers to callbacks: transitions only (``AsyncClient``'s own
    run the follow-ups and hooks registered on it: ``awa.callbacks.resolution``)."""

    complete_external = operation_method(callbacks.complete_external)
    fail_external = operation_method(callbacks.fail_external)
    retry_external = operation_method(callbacks.retry_external)
    resolve_callback = operation_method(callbacks.resolve_callback)
    resume_external = operation_method(callbacks.resume_external)
    heartbeat_callback = operation_method(callbacks.heartbeat_callback)


class ClientMethods(
    TaskMethods,
    ProducerMethods,
    OperatorMethods,
    BatchMethods,
    WorkflowMethods,
    StorageMethods,
):
    """Every method both clients share, and their construction."""

    def __init__(
        self,
        url: str | None = None,
        *,
        max_connections: int = 10,
        application_name: str = DEFAULT_APPLICATION_NAME,
        max_args_bytes: int = MAX_ARGS_BYTES,
        max_metadata_bytes: int = MAX_METADATA_BYTES,
    ) -> None:
        """A client of the database at ``url`` (None: ``DATABASE_URL``, then the libpq
        ``PG*`` variables, then the embedded server), connecting on first use, with up to
        ``max_connections`` pooled connections; inserts refuse args and metadata larger
        than ``max_args_bytes`` and ``max_metadata_bytes`` (as JSON)."""
        check_client_options(max_connections, application_name)
        self._url = url
        self._max_connections = max_connections
        self._application_name = application_name
        self._tasks = TaskRegistry()
        # Every insert of this client (follow-ups and staged ones too): the queue of each
        # kind's task for inserts that name none, per-task defaults and the size limits.
        self._insert_rules = InsertRules(
            self._tasks.routes,
            max_args_bytes,
            max_metadata_bytes,
            self._tasks.defaults,
            DepthLimits(),
        )
        self._setup()

    def _setup(self) -> None:
        """The state of one kind of client (its pool, lock, worker registries)."""

    @property
    def application_name(self) -> str:
        return self._application_name
