"""The blocking client, ``awa.Client``: producer, operator and callback resolution for code
without an event loop (the worker runtime is asyncio-only: see ``awa.AsyncClient``). Its
methods are ``AsyncClient``'s (``awa.client.methods``), run by a blocking driver.

With no URL, it uses ``DATABASE_URL``, then the libpq ``PG*`` variables, then the embedded
server. Connections are opened on first use.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Self, Unpack

import psycopg
import psycopg_pool

from awa import callbacks
from awa.client.methods import ClientMethods
from awa.client.transaction import SyncTransaction
from awa.core.arguments import check_client_options
from awa.model import InsertOpts, JobRow
from awa.observability.tracing import describe_insert, producing
from awa.producer.insert import (
    MAX_ARGS_BYTES,
    MAX_METADATA_BYTES,
    InsertKwargs,
    InsertRules,
    prepare_job,
    split_kwargs,
)
from awa.producer.statements import insert_one_call
from awa.storage.calls import BlockingDriver, ClientCall, Within, client_method, operation_method
from awa.storage.db import (
    DEFAULT_APPLICATION_NAME,
    check_connection_sync,
    resolve_database_url,
    sync_pool,
    translate_errors,
)
from awa.worker.registry import TaskRegistry


def _one(
    args: Any, kind: str | None, opts: InsertOpts, rules: InsertRules
) -> Callable[[Any], ClientCall[JobRow]]:
    def build(span: Any) -> ClientCall[JobRow]:
        job = prepare_job(args, kind=kind, opts=opts, rules=rules)
        describe_insert(span, [job])
        return insert_one_call(job)

    return build


class Client(BlockingDriver, ClientMethods):
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
        self._tasks = TaskRegistry()
        # The routes and defaults of the tasks declared on this client, as AsyncClient's.
        self._insert_rules = InsertRules(
            self._tasks.routes, max_args_bytes, max_metadata_bytes, self._tasks.defaults
        )
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] | None = None
        self._pool_lock = threading.Lock()

    @property
    def application_name(self) -> str:
        return self._application_name

    def database_url(self) -> str:
        """The connection string in use (starting the embedded server if that is the one)."""
        return resolve_database_url(self._url)

    def pool(self) -> psycopg_pool.ConnectionPool[psycopg.Connection[Any]]:
        """The connection pool, opened on first use."""
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
        """Borrow a pooled connection (autocommit) for statements of your own."""
        with translate_errors(), self.pool().connection() as conn:
            yield conn

    def close(self) -> None:
        """Close the pool."""
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

    @client_method
    def insert(self, args: Any, **kwargs: Unpack[InsertKwargs]) -> Within[Any, JobRow]:
        """Insert one job and return its row.

        Raises ValidationError (before touching the database) for bad input and
        UniqueConflict when ``unique_opts`` finds an existing job.
        """
        kind, opts = split_kwargs("insert", kwargs)
        return Within(producing, _one(args, kind, opts, self._insert_rules))

    def transaction(self) -> SyncTransaction:
        """``with client.transaction() as tx:`` commits on success, rolls back on error."""

        def acquire() -> psycopg.Connection[Any]:
            with translate_errors():
                return self.pool().getconn()

        def release(conn: psycopg.Connection[Any]) -> None:
            if self._pool is not None:
                self._pool.putconn(conn)

        return SyncTransaction(acquire, release, self._insert_rules)

    # External callbacks. The blocking client has no lifecycle registry, so these commit the
    # transition alone: follow-up specs and hooks registered on an AsyncClient run only when
    # that client resolves the callback (use one, with asyncio.run, where they must run).
    complete_external = operation_method(callbacks.complete_external)
    fail_external = operation_method(callbacks.fail_external)
    retry_external = operation_method(callbacks.retry_external)
    resolve_callback = operation_method(callbacks.resolve_callback)
    resume_external = operation_method(callbacks.resume_external)
    heartbeat_callback = operation_method(callbacks.heartbeat_callback)
