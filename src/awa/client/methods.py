"""The methods both clients share, each written once (``awa.storage.calls``): producing,
operating jobs and queues, the health check, task routes and defaults, and the capabilities'
methods. ``AsyncClient`` awaits them, ``Client`` blocks."""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, Unpack

from awa import admin
from awa.batch.methods import BatchMethods
from awa.core.arguments import check_flag, check_seconds
from awa.descriptors.methods import DescriptorMethods
from awa.dlq.methods import DlqMethods
from awa.errors import AwaError, DatabaseError, SchemaNotMigrated
from awa.model import JobRow, UniqueOpts
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
from awa.periodic.methods import PeriodicMethods
from awa.producer.copy import copy_flow, with_per_job_opts
from awa.producer.insert import InsertKwargs, InsertRules, TaskDefaults, prepare_many, split_kwargs
from awa.producer.statements import insert_call
from awa.storage.calls import Recovering, Within, client_method, operation_method
from awa.storage.db import Call
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
        return insert_call(prepared)

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
        return copy_flow(jobs, kind=kind, opts=opts_, rules=self._insert_rules)


class OperatorMethods:
    """Jobs and queues (``awa.admin``'s operations on a pooled connection), and health."""

    get_job = operation_method(admin.get_job)
    list_jobs = operation_method(admin.list_jobs)
    cancel = operation_method(admin.cancel)
    cancel_by_unique_key = operation_method(admin.cancel_by_unique_key)
    retry = operation_method(admin.retry)
    pause_queue = operation_method(admin.pause_queue)
    resume_queue = operation_method(admin.resume_queue)
    drain_queue = operation_method(admin.drain_queue)
    queue_stats = operation_method(admin.queue_stats)

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


class ClientMethods(
    TaskMethods,
    ProducerMethods,
    OperatorMethods,
    PeriodicMethods,
    DlqMethods,
    BatchMethods,
    DescriptorMethods,
    WorkflowMethods,
    StorageMethods,
):
    """Every method both clients share."""
