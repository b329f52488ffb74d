"""The asyncio client, ``AsyncClient``: producer, admin, callback resolution with lifecycle
effects, and the worker runtime (the blocking twin is ``awa.client.blocking.Client``).

With no URL, a client uses ``DATABASE_URL``, then the libpq ``PG*`` variables, then the
embedded server. Connections are opened on first use.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self, Unpack

import psycopg
import psycopg_pool

from awa.callbacks.resolution import CallbackResolution
from awa.client.methods import ClientMethods
from awa.client.transaction import Transaction
from awa.core.arguments import check_seconds
from awa.descriptors.duty import store_descriptors
from awa.descriptors.methods import DescriptorDeclarations
from awa.descriptors.operations import DescriptorCatalog
from awa.errors import AwaError, ValidationError
from awa.lifecycle.followups import FollowUpRegistry
from awa.lifecycle.hooks import HookDispatcher, HookRegistry
from awa.lifecycle.registration import LifecycleRegistration
from awa.model import DEFAULT_MAX_ATTEMPTS, DEFAULT_PRIORITY, JobRow
from awa.observability.health import RuntimeHealth
from awa.observability.tracing import describe_insert, producing
from awa.periodic.duty import store_periodic_jobs
from awa.periodic.jobs import PeriodicJob, define_periodic
from awa.producer.backpressure import guarded
from awa.producer.insert import (
    InsertKwargs,
    prepare_job,
    split_kwargs,
)
from awa.producer.lanes import InsertLanes
from awa.producer.statements import insert_one_call
from awa.storage.calls import AsyncDriver
from awa.storage.db import (
    check_connection,
    drive_async,
    new_pool,
    resolve_database_url,
    translate_errors,
)
from awa.storage.migrations import check_version, schema_version_flow
from awa.worker import reference_options
from awa.worker.limits import store_dlq_settings, store_limits, store_retention

if TYPE_CHECKING:
    from awa.worker.runtime import Runtime

QueuesSpec = Iterable[Any] | Mapping[str, int | Mapping[str, Any]] | None


class AsyncClient(
    AsyncDriver, ClientMethods, LifecycleRegistration, CallbackResolution, DescriptorDeclarations
):
    """The asyncio client: inserts, transactions, admin, and (once handlers are registered)
    the worker runtime.

    ``insert`` keyword arguments: ``kind`` (default: derived from the args class name),
    ``queue="default"``, ``priority=2`` (1 runs first, 4 last), ``max_attempts=25``,
    ``tags``, ``metadata``, ``run_at`` (timezone-aware; a future time schedules the job),
    ``unique_opts`` (``awa.UniqueOpts`` or a dict of its fields), ``ordering_key`` and
    ``deadline_duration`` (seconds or timedelta per attempt; 0 means none).
    """

    def _setup(self) -> None:
        self._pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._pool_lock = asyncio.Lock()
        self._resolved_url: str | None = None
        self._runtime: Runtime | None = None
        self._stopping: Runtime | None = None  # the runtime a shutdown is stopping
        self._hooks = HookRegistry()
        self._follow_ups = FollowUpRegistry(self._insert_rules)
        self._periodic: dict[str, PeriodicJob] = {}
        self._descriptors = DescriptorCatalog()  # stored at start()
        # Single inserts crowding in from many coroutines share round trips and commits.
        self._lanes = InsertLanes(
            self._acquire, self._release, lanes=min(4, max(1, self._max_connections // 2))
        )
        self.hook_dispatcher = HookDispatcher(self._hooks)

    # Shared with the blocking client: awa.client.methods (producer, operator, health, tasks).

    async def database_url(self) -> str:
        """The connection string in use (starting the embedded server if that is the one)."""
        if self._resolved_url is None:
            self._resolved_url = await asyncio.to_thread(resolve_database_url, self._url)
        return self._resolved_url

    async def pool(self) -> psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        """The connection pool, opened on first use."""
        if self._pool is None:
            async with self._pool_lock:
                if self._pool is None:
                    url = await self.database_url()
                    await asyncio.to_thread(check_connection, url)
                    pool = new_pool(
                        psycopg_pool.AsyncConnectionPool,
                        url,
                        max_size=self._max_connections,
                        application_name=self._application_name,
                    )
                    with translate_errors():
                        await pool.open(wait=True, timeout=30)
                    self._pool = pool
        return self._pool

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """Borrow a pooled connection (autocommit) for statements of your own."""
        pool = await self.pool()
        with translate_errors():
            async with pool.connection() as conn:
                yield conn

    async def close(self) -> None:
        """Shut the worker down if it runs, stop hooks still running, close the pool."""
        if self._runtime is not None:
            await self.shutdown()
        self.hook_dispatcher.cancel_all()
        await self._lanes.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    # Producer -----------------------------------------------------------------------------

    async def insert(self, args: Any, **kwargs: Unpack[InsertKwargs]) -> JobRow:
        """Insert one job and return its row.

        Raises ValidationError (before touching the database) for bad input and
        UniqueConflict when ``unique_opts`` finds an existing job.
        """
        kind, opts = split_kwargs("insert", kwargs)
        with producing() as span:
            job = prepare_job(args, kind=kind, opts=opts, rules=self._insert_rules)
            describe_insert(span, [job])
            queues = [job.queue]
            if job.depends_on:  # two statements in one transaction: not for the lanes
                return await self._drive(guarded(self._insert_rules, insert_one_call(job), queues))
            limits = self._insert_rules.depth_limits
            if limits is None:
                return await self._lanes.insert(job)
            if limits.due():
                await self._drive(limits.refresh_flow())
            with limits.admitted(queues):
                return await self._lanes.insert(job)

    def transaction(self) -> Transaction:
        """A transaction: ``async with client.transaction() as tx`` or
        ``tx = await client.transaction()``."""
        return Transaction(self._acquire, self._release, self._insert_rules)

    async def _acquire(self) -> psycopg.AsyncConnection[Any]:
        """A pooled connection, until ``_release``."""
        pool = await self.pool()
        with translate_errors():
            return await pool.getconn()

    async def _release(self, conn: psycopg.AsyncConnection[Any]) -> None:
        if self._pool is not None:
            await self._pool.putconn(conn)

    # Worker -------------------------------------------------------------------------------

    def periodic(
        self,
        name: str,
        cron_expr: str,
        args_type: type[Any] | None,
        args: Any,
        *,
        timezone: str = "UTC",
        queue: str | None = None,
        priority: int = DEFAULT_PRIORITY,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        tags: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        missed_fire_policy: str = "coalesce",
    ) -> None:
        """Declare a periodic job: a job of ``args`` enqueued at every fire of
        ``cron_expr`` (5 fields, or 6 with seconds first) in ``timezone``, stored when the
        worker starts and fired by the maintenance leader, once per fire across the fleet.
        ``queue`` None follows the kind's task. ``missed_fire_policy``: after downtime,
        ``"coalesce"`` enqueues only the latest missed fire, ``"catch_up"`` each of them.
        Call it before ``start()``; ValidationError names a bad expression, zone, policy
        or option. See docs/periodic.md."""
        if self._runtime is not None:
            raise AwaError("declare periodic jobs before start()")
        if name in self._periodic:
            raise ValidationError(f"periodic job {name!r} is declared twice")
        self._periodic[name] = define_periodic(
            name,
            cron_expr,
            args_type,
            args,
            timezone=timezone,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            tags=tags,
            metadata=metadata,
            missed_fire_policy=missed_fire_policy,
            rules=self._insert_rules,
        )

    @property
    def runtime(self) -> Runtime | None:
        """The running worker runtime, if ``start()`` was called."""
        return self._runtime

    async def start(self, queues: QueuesSpec = None, **options: Any) -> None:
        """Start working ``queues``: ``[("email", 8), ...]`` (name, max handlers at once),
        a dict ``{"email": 8, "billing": {"max_workers": 2, "deadline_duration": 60}}``
        with per-queue options (max_workers, poll_interval, deadline_duration,
        claim_batch_size, prefetch, retry=awa.RetryPolicy(...), and the flow controls
        rate_limit=(per second, burst), global_max_running, key_concurrency, min_workers,
        weight: docs/flow-control.md), or None for every queue a task declared. Exactly
        these queues are claimed from: other processes may run the rest. ``options`` are
        runtime settings (see ``awa.RuntimeConfig``), such as ``global_max_workers=N`` for
        slots shared by weight."""
        from awa.worker.config import RuntimeConfig, parse_queues
        from awa.worker.runtime import Runtime

        if self._runtime is not None:
            raise AwaError("the worker is already running")
        if len(self._tasks) == 0:
            raise AwaError(
                "register at least one worker before starting the runtime "
                "(decorate a handler with @client.task)"
            )
        # Exactly the queues given: a fleet may split one task module across processes, each
        # running some of its queues (jobs of the others are claimed elsewhere).
        # The reference package's spellings (milliseconds, hours, a list of dicts with
        # "name") become ours; both are accepted.
        options, poll_interval = reference_options.runtime_options(options)
        queues, from_queues = reference_options.queue_options(queues, poll_interval)
        for name, value in from_queues.items():
            if name in options:
                raise ValidationError(f"start(): {name} is given twice (per queue and per worker)")
            options[name] = value
        config = RuntimeConfig.from_options(options)
        configs = parse_queues(
            queues, self._tasks.queues(), global_max_workers=config.global_max_workers
        )
        async with self.connection() as conn:
            check_version(await drive_async(conn, schema_version_flow()))
            # First: it refuses a descriptor of an unknown queue before anything is stored.
            names = [queue.name for queue in configs]
            await store_descriptors(conn, self._descriptors, names, self._tasks.routes)
            # Declared schedules are stored before anything runs (never deleting others').
            await store_periodic_jobs(conn, self._periodic.values(), self._insert_rules)
            await store_limits(conn, configs)
            await store_retention(conn, configs)
            await store_dlq_settings(conn, configs, config.dlq_enabled)
        runtime = Runtime(
            self,
            self._tasks,
            configs,
            config,
            hooks=self.hook_dispatcher,
            follow_ups=self._follow_ups,
        )
        await self.pool()
        self._runtime = runtime
        try:
            await runtime.start()
        except BaseException:
            self._runtime = None
            await runtime.shutdown(0)
            raise

    async def shutdown(
        self, timeout: float | None = None, *, timeout_ms: float | None = None
    ) -> None:
        """Stop the worker: no new claims, running handlers get ``timeout`` seconds (default
        30; ``timeout_ms``: the same in milliseconds), then see ``job.is_cancelled()``;
        whatever is still running after that is interrupted and requeued. Lifecycle hooks
        are not waited for. ``shutdown(0)`` while a shutdown is under way cuts its wait short
        (what ``awa worker`` does on a second SIGTERM)."""
        if timeout is not None and timeout_ms is not None:
            raise ValidationError("shutdown(): give timeout (seconds) or timeout_ms, not both")
        if timeout_ms is not None:
            timeout = check_seconds("timeout_ms", timeout_ms) / 1000
        timeout = 30.0 if timeout is None else check_seconds("timeout", timeout)
        runtime, self._runtime = self._runtime, None
        if runtime is None:
            if self._stopping is not None and timeout == 0:
                self._stopping.hurry()  # a second, impatient call: interrupt handlers now
            return
        self._stopping = runtime
        try:
            await runtime.shutdown(timeout)
        finally:
            self._stopping = None

    @contextlib.asynccontextmanager
    async def run(
        self, queues: QueuesSpec = None, *, shutdown_timeout: float = 30.0, **options: Any
    ) -> AsyncIterator[Self]:
        """``async with client.run(queues):`` works the queues for the block's duration."""
        check_seconds("shutdown_timeout", shutdown_timeout)
        await self.start(queues, **options)
        try:
            yield self
        finally:
            await self.shutdown(shutdown_timeout)

    def _runtime_health(self) -> RuntimeHealth | None:
        return self._runtime.health() if self._runtime is not None else None
