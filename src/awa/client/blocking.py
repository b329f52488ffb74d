"""The blocking client, ``awa.Client``: producer, admin and callback resolution for code
without an event loop (the worker runtime is asyncio-only: see ``awa.AsyncClient``).

With no URL, it uses ``DATABASE_URL``, then the libpq ``PG*`` variables, then the embedded
server. Connections are opened on first use.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, Unpack

import psycopg
import psycopg_pool

from awa import admin, callbacks
from awa.admin import CronJob, QueueStats
from awa.batch.methods import BatchMethods
from awa.callbacks.resolution import CallbackId
from awa.client.transaction import SyncTransaction, insert_prepared_sync
from awa.core.arguments import check_client_options, check_seconds
from awa.descriptors.operations import DescriptorListing
from awa.dlq.methods import DlqMethods
from awa.errors import DatabaseError, SchemaNotMigrated
from awa.model import JobRow, JobState
from awa.observability.health import (
    DEFAULT_UNSERVED_AFTER,
    HEALTH_CHECK_TIMEOUT,
    HealthCheck,
    health_flow,
    schema_missing,
    unreachable,
)
from awa.observability.tracing import describe_insert, producing
from awa.producer.copy import copy_flow, with_per_job_opts
from awa.producer.insert import (
    MAX_ARGS_BYTES,
    MAX_METADATA_BYTES,
    InsertKwargs,
    InsertRules,
    prepare_job,
    prepare_many,
    split_kwargs,
)
from awa.storage.db import (
    DEFAULT_APPLICATION_NAME,
    check_connection_sync,
    drive_sync,
    resolve_database_url,
    sync_pool,
    translate_errors,
)
from awa.storage.methods import StorageMethods
from awa.storage.migrations import migrate_sync
from awa.workflows.methods import WorkflowMethods


class Client(DlqMethods, DescriptorListing, BatchMethods, WorkflowMethods, StorageMethods):
    """The blocking client for producers and operators (the worker runtime is asyncio-only:
    use AsyncClient for it). Safe to share between threads."""

    def __init__(
        self,
        url: str | None = None,
        *,
        max_connections: int = 10,
        application_name: str = DEFAULT_APPLICATION_NAME,
        max_args_bytes: int = MAX_ARGS_BYTES,
        max_metadata_bytes: int = MAX_METADATA_BYTES,
    ) -> None:
        check_client_options(max_connections, application_name)
        self._url = url
        self._max_connections = max_connections
        self._application_name = application_name
        self._insert_rules = InsertRules(
            max_args_bytes=max_args_bytes, max_metadata_bytes=max_metadata_bytes
        )
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] | None = None
        self._pool_lock = threading.Lock()

    def database_url(self) -> str:
        return resolve_database_url(self._url)

    def pool(self) -> psycopg_pool.ConnectionPool[psycopg.Connection[Any]]:
        if self._pool is None:
            with self._pool_lock:
                if self._pool is None:
                    url = self.database_url()
                    pool = sync_pool(
                        url,
                        min_size=1,
                        max_size=self._max_connections,
                        application_name=self._application_name,
                    )
                    check_connection_sync(url)
                    with translate_errors():
                        pool.open(wait=True, timeout=30)
                    self._pool = pool
        return self._pool

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        with translate_errors(), self.pool().connection() as conn:
            yield conn

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def migrate(self) -> list[int]:
        with self.connection() as conn:
            return migrate_sync(conn)

    def insert(self, args: Any, **kwargs: Unpack[InsertKwargs]) -> JobRow:
        kind, opts = split_kwargs("insert", kwargs)
        with producing() as span:
            job = prepare_job(args, kind=kind, opts=opts, rules=self._insert_rules)
            describe_insert(span, [job])
            with self.connection() as conn:
                return insert_prepared_sync(conn, [job])[0]

    def insert_many(self, jobs: Iterable[Any], **kwargs: Unpack[InsertKwargs]) -> list[JobRow]:
        kind, opts = split_kwargs("insert_many", kwargs)
        with producing() as span:
            prepared = prepare_many(jobs, kind=kind, opts=opts, rules=self._insert_rules)
            describe_insert(span, prepared)
            with self.connection() as conn:
                return insert_prepared_sync(conn, prepared)

    def insert_many_copy(
        self,
        jobs: Iterable[Any],
        *,
        opts: Sequence[Mapping[str, Any] | None] | None = None,
        **kwargs: Unpack[InsertKwargs],
    ) -> list[JobRow]:
        jobs = with_per_job_opts(jobs, opts)
        kind, opts_ = split_kwargs("insert_many_copy", kwargs)
        rules = self._insert_rules
        with self.connection() as conn, conn.transaction():
            return drive_sync(conn, copy_flow(jobs, kind=kind, opts=opts_, rules=rules))

    def transaction(self) -> SyncTransaction:
        """``with client.transaction() as tx:`` commits on success, rolls back on error."""

        def acquire() -> psycopg.Connection[Any]:
            with translate_errors():
                return self.pool().getconn()

        def release(conn: psycopg.Connection[Any]) -> None:
            if self._pool is not None:
                self._pool.putconn(conn)

        return SyncTransaction(acquire, release, self._insert_rules)

    def health_check(self, *, unserved_after: float = DEFAULT_UNSERVED_AFTER) -> HealthCheck:
        """Database reachable and migrated, a maintenance leader somewhere, the live
        workers, each queue's backlog and lag, and the queues nobody serves (see
        ``AsyncClient.health_check``)."""
        check_seconds("unserved_after", unserved_after)
        try:
            pool = self.pool()
            with translate_errors(), pool.connection(timeout=HEALTH_CHECK_TIMEOUT) as conn:
                return drive_sync(conn, health_flow(None, unserved_after))
        except SchemaNotMigrated:
            return schema_missing(None)
        except DatabaseError as error:
            return unreachable(error, None)

    def get_job(self, job_id: int) -> JobRow | None:
        with self.connection() as conn:
            return admin.get_job(conn, job_id)

    def list_jobs(
        self,
        *,
        state: JobState | str | None = None,
        kind: str | None = None,
        queue: str | None = None,
        limit: int = 100,
    ) -> list[JobRow]:
        with self.connection() as conn:
            return admin.list_jobs(conn, state=state, kind=kind, queue=queue, limit=limit)

    def cancel(self, job_id: int) -> JobRow | None:
        with self.connection() as conn:
            return admin.cancel(conn, job_id)

    def cancel_by_unique_key(
        self,
        kind: str,
        *,
        args: Any = None,
        queue: str | None = None,
        period_bucket: int | None = None,
    ) -> JobRow | None:
        with self.connection() as conn:
            return admin.cancel_by_unique_key(
                conn, kind, args=args, queue=queue, period_bucket=period_bucket
            )

    def retry(self, job_id: int) -> JobRow | None:
        with self.connection() as conn:
            return admin.retry(conn, job_id)

    def retry_failed(
        self, *, kind: str | None = None, queue: str | None = None
    ) -> admin.RetryFailedResult:
        with self.connection() as conn:
            return admin.retry_failed(conn, kind=kind, queue=queue)

    def discard_failed(self, kind: str) -> int:
        with self.connection() as conn:
            return admin.discard_failed(conn, kind)

    def pause_queue(self, queue: str, *, paused_by: str | None = None) -> None:
        with self.connection() as conn:
            admin.pause_queue(conn, queue, paused_by=paused_by)

    def resume_queue(self, queue: str) -> bool:
        with self.connection() as conn:
            return admin.resume_queue(conn, queue)

    def drain_queue(self, queue: str) -> int:
        with self.connection() as conn:
            return admin.drain_queue(conn, queue)

    def queue_stats(self) -> list[QueueStats]:
        with self.connection() as conn:
            return admin.queue_stats(conn)

    def list_cron_jobs(self) -> list[CronJob]:
        with self.connection() as conn:
            return admin.list_cron_jobs(conn)

    def pause_cron_job(self, name: str, *, paused_by: str | None = None) -> bool:
        with self.connection() as conn:
            return admin.pause_cron_job(conn, name, paused_by=paused_by)

    def resume_cron_job(self, name: str) -> bool:
        with self.connection() as conn:
            return admin.resume_cron_job(conn, name)

    def trigger_cron_job(self, name: str) -> JobRow | None:
        with self.connection() as conn:
            return admin.trigger_cron_job(conn, name)

    def delete_cron_job(self, name: str) -> bool:
        with self.connection() as conn:
            return admin.delete_cron_job(conn, name)

    # External callbacks. The blocking client has no lifecycle registry, so these commit the
    # transition alone: follow-up specs and hooks registered on an AsyncClient run only when
    # that client resolves the callback (use one, with asyncio.run, where they must run).

    def complete_external(
        self, callback_id: CallbackId, payload: Any = None, run_lease: int | None = None
    ) -> JobRow:
        """Complete the job holding this callback; the payload, if any, becomes its output.
        CallbackNotFound when no parked or running job holds it."""
        with self.connection() as conn:
            return callbacks.complete_external(conn, callback_id, payload, run_lease)

    def fail_external(
        self, callback_id: CallbackId, error: str, run_lease: int | None = None
    ) -> JobRow:
        """Fail the job holding this callback, with ``error`` in its history."""
        with self.connection() as conn:
            return callbacks.fail_external(conn, callback_id, error, run_lease)

    def retry_external(self, callback_id: CallbackId, run_lease: int | None = None) -> JobRow:
        """Run a parked job again, from a fresh attempt budget."""
        with self.connection() as conn:
            return callbacks.retry_external(conn, callback_id, run_lease)

    def resolve_callback(
        self,
        callback_id: CallbackId,
        payload: Any = None,
        default_action: callbacks.DefaultAction = "ignore",
        run_lease: int | None = None,
    ) -> callbacks.ResolveResult:
        """Complete, fail or ignore by the callback's CEL expressions; without expressions,
        do ``default_action``."""
        with self.connection() as conn:
            return callbacks.resolve_callback(conn, callback_id, payload, default_action, run_lease)

    def resume_external(
        self, callback_id: CallbackId, payload: Any = None, run_lease: int | None = None
    ) -> JobRow:
        """Hand ``payload`` to the job: a handler waiting in ``wait_for_callback`` gets it; a
        parked job runs again and finds it in ``job.callback_result``."""
        with self.connection() as conn:
            return callbacks.resume_external(conn, callback_id, payload, run_lease)

    def heartbeat_callback(
        self, callback_id: CallbackId, timeout_seconds: float = callbacks.DEFAULT_TIMEOUT
    ) -> JobRow:
        """Push a parked job's callback timeout to ``timeout_seconds`` from now."""
        with self.connection() as conn:
            return callbacks.heartbeat_callback(conn, callback_id, timeout_seconds)
