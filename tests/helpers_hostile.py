"""Hostile input, shared by the test_hostile_* modules: the bad values of each class (names,
ids, limits, durations, id lists, free text), tables of (entry point, argument) rows expanded
into one case per bad value, and a snapshot of every awa table to show that a refused call
stored or changed nothing.

A row names the argument its message must mention and the class of bad values it takes;
adding a parameter to an entry point means adding one row."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import pytest

from jobs_helpers import Conn

BIGINT_MAX = 2**63 - 1

# Each class: case id -> bad value. Every value must be refused wherever the class applies.
NAMES: dict[str, Any] = {
    "empty": "",
    "nul": "a\x00b",
    "surrogate": "q\ud800",
    "10000-chars": "x" * 10_000,
    "int": 5,
}
TEXT: dict[str, Any] = {
    "nul": "a\x00b",
    "surrogate": "q\ud800",
    "10000-chars": "x" * 10_000,
    "int": 5,
}
IDS: dict[str, Any] = {
    "beyond-bigint": 2**63,
    "below-bigint": -(2**63) - 1,
    "zero": 0,
    "negative": -1,
    "bool": True,
    "str": "5",
    "float": 5.0,
    "nan": math.nan,
}
LEASES: dict[str, Any] = {
    "beyond-bigint": 2**63,
    "negative": -1,
    "bool": True,
    "str": "1",
    "nan": math.nan,
}
LIMITS: dict[str, Any] = {
    "zero": 0,
    "negative": -1,
    "1001": 1001,
    "5000": 5000,
    "beyond-bigint": 2**63,
    "bool": True,
    "str": "10",
    "float": 10.0,
    "nan": math.nan,
}
SECONDS: dict[str, Any] = {
    "nan": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "negative": -1,
    "str": "5",
    "bool": True,
    "beyond-100-years": 1e300,
    "beyond-float": 10**400,
}
ID_LISTS: dict[str, Any] = {
    "empty": [],
    "10001-ids": range(1, 10_002),
    "str": "123",
    "bad-item": [1, "2"],
    "beyond-bigint-item": [1, 2**63],
    "zero-item": [0],
    "int": 7,
}
PRIORITIES: dict[str, Any] = {
    "zero": 0,
    "five": 5,
    "bool": True,
    "str": "1",
    "nan": math.nan,
    "beyond-bigint": 2**63,
}
FLAGS: dict[str, Any] = {"str": "yes", "int": 1, "none": None}

# Names that are valid and must be stored exactly as given, never read as paths or markup.
ODD_NAMES: dict[str, str] = {
    "slash": "a/b",
    "dotdot": "../../jobs/1/discard",
    "control": "bell\x07\x1b[31mred",
    "newline": "two\nlines",
    "percent": "%s%(x)s",
    "quote": "x'); DROP TABLE awa.jobs;--",
    "200-chars": "é" * 200,
}


@dataclasses.dataclass(frozen=True)
class Row:
    """One argument of one entry point: ``call(target, value)`` passes ``value`` as that
    argument; ``field`` is what the error message must name; ``values`` the bad values;
    ``skip`` the case ids that do not apply (a value that is valid for this argument);
    ``only`` limits the row to some targets (e.g. the async client)."""

    name: str
    field: str
    values: Mapping[str, Any]
    call: Callable[[Any, Any], Any]
    skip: frozenset[str] = frozenset()
    only: frozenset[str] = frozenset()


def row(
    name: str,
    field: str,
    values: Mapping[str, Any],
    call: Callable[[Any, Any], Any],
    *,
    skip: Iterable[str] = (),
    only: Iterable[str] = (),
) -> Row:
    return Row(name, field, values, call, frozenset(skip), frozenset(only))


def cases(rows: Iterable[Row]) -> Iterator[Any]:
    """One pytest param per (row, bad value), id ``row-name[value-id]``."""
    for entry in rows:
        for case_id, value in entry.values.items():
            if case_id not in entry.skip:
                yield pytest.param(entry, value, id=f"{entry.name}[{case_id}]")


TABLES = (
    "awa.jobs",
    "awa.job_dependencies",
    "awa.queues",
    "awa.queue_limits",
    "awa.cron_jobs",
    "awa.dlq_entries",
    "awa.batch_operations",
    "awa.queue_descriptors",
    "awa.job_kind_descriptors",
    "awa.runtimes",
    "awa.queue_overrides",
    "awa.queue_override_log",
    "awa.queue_depth_limits",
)


def snapshot(conn: Conn) -> dict[str, tuple[int, str]]:
    """Each awa table's row count and a digest of its rows: equal snapshots mean nothing
    was stored, changed or deleted."""
    found = {}
    for table in TABLES:
        result = conn.execute(
            f"SELECT count(*), md5(COALESCE(string_agg(t::text, '|' ORDER BY t::text), ''))"
            f" FROM {table} AS t"
        ).fetchone()
        assert result is not None
        found[table] = (int(result[0]), str(result[1]))
    return found


def assert_names(error: BaseException, *fragments: str) -> None:
    """The message names each fragment (the argument, the limit) and stays readable: a
    10,000-character value is not echoed back whole."""
    message = str(error)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message[:300]!r}"
    assert len(message) < 1000, f"message of {len(message)} characters: {message[:200]!r}"
