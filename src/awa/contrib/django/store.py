"""Where the task backend writes and reads its jobs.

With ``settings.AWA['DATABASE']`` (the default) that is Django's own connection for the
alias: an enqueue joins whatever transaction the caller has open there, and a result read
sees it too. With ``settings.AWA['URL']`` it is a blocking ``awa.Client`` for the process,
so an enqueue commits on its own.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, cast

from awa import admin
from awa.client.blocking import Client
from awa.model import JobRow
from awa.producer import bridge
from awa.storage.db import Statement


class JobStore(Protocol):
    def insert(self, args: dict[str, Any], **options: Any) -> JobRow: ...

    def get(self, job_id: int) -> JobRow | None: ...


class DjangoStore:
    """Jobs through ``django.db.connections[alias]``, in the caller's transaction."""

    def __init__(self, alias: str) -> None:
        self.alias = alias

    def _connection(self) -> Any:
        from django.db import connections

        return connections[self.alias]

    def insert(self, args: dict[str, Any], **options: Any) -> JobRow:
        return bridge.insert_job_sync(self._connection(), args, **options)

    def get(self, job_id: int) -> JobRow | None:
        statement = admin.get_job.build(job_id)
        assert isinstance(statement, Statement)  # one statement, not a flow
        # The bridge's runner gives rows as psycopg would (JSON decoded, timestamps aware)
        # whichever driver Django uses; it is the same runner insert_job_sync uses.
        run = bridge.statement_runner_sync(self._connection(), "get_job")
        return cast(JobRow | None, run(statement))


class ClientStore:
    """Jobs through a blocking ``awa.Client`` on ``url``, each statement committed alone."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._client: Client | None = None
        self._lock = threading.Lock()

    def client(self) -> Client:
        with self._lock:
            if self._client is None:
                self._client = Client(self.url)
            return self._client

    def insert(self, args: dict[str, Any], **options: Any) -> JobRow:
        return self.client().insert(args, **options)

    def get(self, job_id: int) -> JobRow | None:
        return self.client().get_job(job_id)
