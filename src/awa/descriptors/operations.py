"""Descriptors: what a queue or a job kind is for, for the people who operate it.

A client declares them in code before its worker starts::

    client.queue_descriptor("email", display_name="Outbound email", owner="growth@example.com",
                            docs_url="https://runbooks.example.com/email", tags=["user-facing"])
    client.job_kind_descriptor("send_email", description="Renders a template, hands it to SES")

and the worker stores them when it starts (``awa.queue_descriptors``,
``awa.job_kind_descriptors``), with a blank row for every other queue it runs and kind it
registers. The leader keeps the rows of running queues fresh and deletes those nothing has
seen for ``descriptor_retention`` (30 days). ``list_queue_descriptors`` and
``list_job_kind_descriptors`` read them on any psycopg connection (also in ``awa.admin``, on
the clients, in ``awa queue descriptors`` / ``awa job kinds`` and on the UI's overview).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import blake3

from awa.core.arguments import check_text
from awa.core.kinds import dump_json
from awa.errors import ValidationError
from awa.model import MAX_NAME_LENGTH, check_name, check_tags
from awa.sql import query
from awa.storage.db import Statement, operation

__all__ = [
    "Descriptor",
    "DescriptorCatalog",
    "JobKindDescriptor",
    "QueueDescriptor",
    "list_job_kind_descriptors",
    "list_queue_descriptors",
]

MAX_DISPLAY_NAME = 200
MAX_DESCRIPTION = 2000
MAX_OWNER = 200
MAX_DOCS_URL = 2048
MAX_EXTRA_BYTES = 64 * 1024
DOCS_URL_SCHEMES = ("http", "https")


def _text(field: str, value: object, limit: int) -> str | None:
    return None if value is None else check_text(field, value, limit)


def _docs_url(value: object) -> str | None:
    url = _text("docs_url", value, MAX_DOCS_URL)
    if url is None:
        return None
    parts = urllib.parse.urlsplit(url)
    # The UI renders it as a link: only web addresses (never javascript: and the like).
    if parts.scheme.lower() not in DOCS_URL_SCHEMES or not parts.netloc or " " in url:
        raise ValidationError(
            f"docs_url must be an http:// or https:// URL with a host, got {url!r}"
        )
    return url


def _extra(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValidationError(f"extra must be a dict (a JSON object), not {type(value).__name__}")
    text = dump_json(dict(value), "extra", sort_keys=True)
    if len(text.encode()) > MAX_EXTRA_BYTES:
        raise ValidationError(
            f"extra is {len(text.encode())} bytes as JSON; the limit is {MAX_EXTRA_BYTES}"
        )
    result: dict[str, Any] = dict(value)
    return result


def _tags(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    tags = check_tags(value)
    for tag in tags:
        if not tag or len(tag) > MAX_NAME_LENGTH:
            raise ValidationError(f"descriptor tags must be 1 to {MAX_NAME_LENGTH} characters")
    return tuple(tags)


@dataclasses.dataclass(frozen=True, slots=True)
class Descriptor:
    """The declared metadata of a queue or a job kind (every field optional)."""

    display_name: str | None = None
    description: str | None = None
    owner: str | None = None
    docs_url: str | None = None
    tags: tuple[str, ...] = ()
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(
        cls,
        *,
        display_name: object = None,
        description: object = None,
        owner: object = None,
        docs_url: object = None,
        tags: object = None,
        extra: object = None,
    ) -> Descriptor:
        """A validated descriptor; ValidationError names the field and its limit."""
        return cls(
            display_name=_text("display_name", display_name, MAX_DISPLAY_NAME),
            description=_text("description", description, MAX_DESCRIPTION),
            owner=_text("owner", owner, MAX_OWNER),
            docs_url=_docs_url(docs_url),
            tags=_tags(tags),
            extra=_extra(extra),
        )

    def fields(self) -> dict[str, Any]:
        return {
            "display_name": self.display_name,
            "description": self.description,
            "owner": self.owner,
            "docs_url": self.docs_url,
            "tags": list(self.tags),
            "extra": dict(self.extra),
        }

    @property
    def descriptor_hash(self) -> str:
        """BLAKE3 of the fields as canonical JSON (the reference package's hash of the same
        descriptor), so that a change is noticed when it is stored."""
        canonical = dump_json(self.fields(), "descriptor", sort_keys=True)
        return blake3.blake3(canonical.encode()).hexdigest()


_BLANK: dict[str, Any] = {**Descriptor().fields(), "descriptor_hash": None}


class DescriptorCatalog:
    """The descriptors a client declared, by queue and by kind, until its worker starts."""

    def __init__(self) -> None:
        self.queues: dict[str, Descriptor] = {}
        self.kinds: dict[str, Descriptor] = {}

    def queue_rows(self, started: Sequence[str], declared: Iterable[str]) -> list[dict[str, Any]]:
        """A row per started queue (blank when not described). A descriptor of a queue no
        task declares and this worker does not run is a typo: ValidationError. One that
        another worker of the fleet runs is stored by that worker."""
        known = set(started) | set(declared)
        for queue in self.queues:
            if queue not in known:
                raise ValidationError(f"queue descriptor declared for unknown queue {queue!r}")
        return [_row("queue", queue, self.queues.get(queue)) for queue in dict.fromkeys(started)]

    def kind_rows(self, routes: Mapping[str, str]) -> list[dict[str, Any]]:
        """A row per registered kind (with its task's queue) and per described kind."""
        kinds = dict.fromkeys([*routes, *self.kinds])
        return [
            {**_row("kind", kind, self.kinds.get(kind)), "queue": routes.get(kind)}
            for kind in kinds
        ]


def _row(key: str, name: str, descriptor: Descriptor | None) -> dict[str, Any]:
    if descriptor is None:
        return {key: name, **_BLANK}
    return {key: name, **descriptor.fields(), "descriptor_hash": descriptor.descriptor_hash}


# Reading ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class QueueDescriptor:
    """A queue's stored descriptor. ``declared`` is False on a blank row (a worker ran the
    queue, nothing described it); ``live`` says whether a live worker runs it now;
    ``last_seen_at`` is when a worker last started with it or the leader saw it run."""

    queue: str
    display_name: str | None
    description: str | None
    owner: str | None
    docs_url: str | None
    tags: list[str]
    extra: dict[str, Any]
    descriptor_hash: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    last_seen_at: dt.datetime
    live: bool

    @property
    def declared(self) -> bool:
        return self.descriptor_hash is not None


@dataclasses.dataclass(frozen=True, slots=True)
class JobKindDescriptor:
    """A job kind's stored descriptor; ``queue`` is the queue its task is registered on
    (None when only described). The other fields as in ``QueueDescriptor``."""

    kind: str
    queue: str | None
    display_name: str | None
    description: str | None
    owner: str | None
    docs_url: str | None
    tags: list[str]
    extra: dict[str, Any]
    descriptor_hash: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    last_seen_at: dt.datetime
    live: bool

    @property
    def declared(self) -> bool:
        return self.descriptor_hash is not None


def _queue_records(rows: list[dict[str, Any]]) -> list[QueueDescriptor]:
    return [QueueDescriptor(**row) for row in rows]


def _kind_records(rows: list[dict[str, Any]]) -> list[JobKindDescriptor]:
    return [JobKindDescriptor(**row) for row in rows]


@operation
def list_queue_descriptors(*, queue: str | None = None) -> Statement[list[QueueDescriptor]]:
    """Every queue's descriptor (blank ones included), by name; or only ``queue``'s."""
    params = {"queue": check_name("queue", queue) if queue is not None else None}
    return Statement(query("list_queue_descriptors"), params, _queue_records)


@operation
def list_job_kind_descriptors(*, kind: str | None = None) -> Statement[list[JobKindDescriptor]]:
    """Every job kind's descriptor (blank ones included), by name; or only ``kind``'s."""
    params = {"kind": check_name("kind", kind) if kind is not None else None}
    return Statement(query("list_job_kind_descriptors"), params, _kind_records)
