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
from typing import Any, Unpack

import psycopg
import psycopg_pool

from awa.client.methods import CallbackMethods, ClientMethods
from awa.client.transaction import SyncTransaction
from awa.model import InsertOpts, JobRow
from awa.observability.tracing import describe_insert, producing
from awa.producer.backpressure import guarded
from awa.producer.insert import (
    InsertKwargs,
    InsertRules,
    prepare_job,
    split_kwargs,
)
from awa.producer.statements import insert_one_call
from awa.storage.calls import BlockingDriver, ClientCall, Within, client_method
from awa.storage.db import (
    check_connection,
    new_pool,
    resolve_database_url,
    translate_errors,
)


def _one(
    args: Any, kind: str | None, opts: InsertOpts, rules: InsertRules
) -> Callable[[Any], ClientCall[JobRow]]:
    def build(span: Any) -> ClientCall[JobRow]:
        job = prepare_job(args, kind=kind, opts=opts, rules=rules)
        describe_insert(span, [job])
        return guarded(rules, insert_one_call(job), [job.queue])

    return build


class Client(BlockingDriver, ClientMethods, CallbackMethods):
    """The blocking client for producers and operators (the worker runtime is asyncio-only:
    use AsyncClient for it). Safe to share between threads."""

    def _setup(self) -> None:
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[Any]] | None = None
        self._pool_lock = threading.Lock()

    def database_url(self) -> str:
        """The connection string in use (starting the embedded server if that is the one)."""
        return resolve_database_url(self._url)

    def pool(self) -> psycopg_pool.ConnectionPool[psycopg.Connection[Any]]:
        """The connection pool, opened on first use."""
        if self._pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = self._open_pool()
        return self._pool

    def _open_pool(self) -> psycopg_pool.ConnectionPool[psycopg.Connection[Any]]:
        url = self.database_url()
        check_connection(url)
        size, name = self._max_connections, self._application_name
        pool = new_pool(psycopg_pool.ConnectionPool, url, max_size=size, application_name=name)
        with translate_errors():
            pool.open(wait=True, timeout=30)
        return pool

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
