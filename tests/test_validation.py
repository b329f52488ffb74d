"""Bad input is refused with a ValidationError naming the field and the limit, before anything
reaches the database, on every insert path."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
from typing import Any

import pytest

import awa
from jobs_helpers import INSERT_PATHS, Conn, count_jobs, insert_many_via, insert_via


@dataclasses.dataclass
class Ping:
    n: int = 1


@dataclasses.dataclass
class Measurement:
    value: float


class Opaque:
    """A class pydantic knows nothing about."""


@dataclasses.dataclass
class HoldsOpaque:
    thing: Opaque


@dataclasses.dataclass
class HoldsAnything:
    thing: object


PLUS_ONE = dt.timezone(dt.timedelta(hours=1))
MINUS_ONE = dt.timezone(dt.timedelta(hours=-1))

# (case id, args, insert keyword arguments, fragments the message must contain)
BAD_INPUT: list[tuple[str, Any, dict[str, Any], tuple[str, ...]]] = [
    ("priority-0", Ping(), {"priority": 0}, ("priority", "between 1 and 4")),
    ("priority-5", Ping(), {"priority": 5}, ("priority", "between 1 and 4")),
    ("max-attempts-0", Ping(), {"max_attempts": 0}, ("max_attempts", "between 1 and 1000")),
    ("max-attempts-1001", Ping(), {"max_attempts": 1001}, ("max_attempts", "1 and 1000")),
    ("priority-not-int", Ping(), {"priority": "1"}, ("priority", "integer")),
    ("kind-empty", Ping(), {"kind": ""}, ("kind", "empty")),
    ("kind-201", Ping(), {"kind": "k" * 201}, ("kind", "201", "200")),
    ("queue-empty", Ping(), {"queue": ""}, ("queue", "empty")),
    ("queue-201", Ping(), {"queue": "q" * 201}, ("queue", "201", "200")),
    ("tags-21", Ping(), {"tags": [f"t{i}" for i in range(21)]}, ("21 tags", "20")),
    ("tags-string", Ping(), {"tags": "abc"}, ("tags", "list")),
    ("nul-kind", Ping(), {"kind": "a\x00b"}, ("kind", "NUL")),
    ("nul-queue", Ping(), {"queue": "a\x00b"}, ("queue", "NUL")),
    ("nul-tag", Ping(), {"tags": ["ok", "a\x00b"]}, ("tag", "NUL")),
    ("nul-metadata", Ping(), {"metadata": {"k": {"deep": "a\x00"}}}, ("metadata", "NUL")),
    ("nul-metadata-key", Ping(), {"metadata": {"a\x00": 1}}, ("metadata", "key", "NUL")),
    ("nul-args-value", {"s": "a\x00b"}, {"kind": "k"}, ("args['s']", "NUL")),
    (
        "nul-args-nested",
        {"o": {"l": ["fine", "bad\x00"]}},
        {"kind": "k"},
        ("args['o']['l'][1]", "NUL"),
    ),
    ("nul-args-key", {"a\x00": 1}, {"kind": "k"}, ("args", "key", "NUL")),
    ("run-at-naive", Ping(), {"run_at": dt.datetime(2030, 1, 1)}, ("run_at", "timezone")),
    (
        "run-at-year-10000",
        Ping(),
        {"run_at": "10000-01-01T00:00:00+00:00"},
        ("run_at", "9999"),
    ),
    ("run-at-garbage", Ping(), {"run_at": "tomorrow"}, ("run_at", "ISO 8601")),
    (
        "run-at-before-year-1",
        Ping(),
        {"run_at": dt.datetime(1, 1, 1, tzinfo=PLUS_ONE)},
        ("run_at", "1-9999"),
    ),
    (
        "run-at-after-9999",
        Ping(),
        {"run_at": dt.datetime(9999, 12, 31, 23, 30, tzinfo=MINUS_ONE)},
        ("run_at", "1-9999"),
    ),
    ("run-at-int", Ping(), {"run_at": 1700000000}, ("run_at", "datetime")),
    ("args-set", {"s": {1, 2}}, {"kind": "k"}, ("args", "JSON", "set")),
    ("args-nan", {"f": float("nan")}, {"kind": "k"}, ("args", "JSON")),
    ("args-inf", {"f": float("inf")}, {"kind": "k"}, ("args", "JSON")),
    ("args-nan-in-tuple", {"t": (1, float("nan"))}, {"kind": "k"}, ("args['t'][1]", "NaN")),
    (
        "args-nan-in-ordereddict",
        {"o": collections.OrderedDict(x=float("-inf"))},
        {"kind": "k"},
        ("args['o']['x']", "NaN or infinite"),
    ),
    (
        "args-nan-in-defaultdict",
        collections.defaultdict(list, f=[float("nan")]),
        {"kind": "k"},
        ("args['f'][0]", "NaN or infinite"),
    ),
    ("metadata-nan", Ping(), {"metadata": {"m": float("nan")}}, ("metadata['m']", "NaN")),
    ("args-object", {"o": object()}, {"kind": "k"}, ("args", "JSON", "object")),
    ("args-dataclass-nan", Measurement(float("nan")), {}, ("args", "JSON")),
    ("args-dataclass-object", HoldsAnything(object()), {}, ("args", "JSON")),
    ("args-dataclass-unknown-type", HoldsOpaque(Opaque()), {}, ("args", "Opaque")),
    ("args-int", 42, {"kind": "k"}, ("args", "dataclass", "int")),
    ("args-list", [1, 2], {"kind": "k"}, ("args", "dataclass", "list")),
    ("metadata-list", Ping(), {"metadata": ["a"]}, ("metadata", "dict")),
    ("ordering-key-int", Ping(), {"ordering_key": 5}, ("ordering_key", "bytes")),
    ("deadline-negative", Ping(), {"deadline_duration": -1}, ("deadline_duration", "negative")),
    ("deadline-inf", Ping(), {"deadline_duration": float("inf")}, ("deadline_duration", "finite")),
    ("deadline-huge", Ping(), {"deadline_duration": 1e20}, ("deadline_duration", "36525 days")),
    (
        "deadline-beyond-postgres",
        Ping(),
        {"deadline_duration": dt.timedelta(days=200_000_000)},
        ("deadline_duration", "36525 days"),
    ),
    (
        "deadline-101-years",
        Ping(),
        {"deadline_duration": dt.timedelta(days=36526)},
        ("deadline_duration", "36525 days"),
    ),
    ("unique-unknown-key", Ping(), {"unique_opts": {"by_qeue": True}}, ("unique_opts", "by_qeue")),
]


def assert_names(error: pytest.ExceptionInfo[Exception], fragments: tuple[str, ...]) -> None:
    for fragment in fragments:
        assert fragment in str(error.value)


# Each case runs through every insert path (both clients and a transaction of each) in one
# test, so the matrix stays readable and fast.
@pytest.mark.parametrize(
    ("args", "kwargs", "fragments"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_INPUT],
)
async def test_bad_input_is_refused_before_the_database(
    client: awa.AsyncClient,
    sync_client: awa.Client,
    conn: Conn,
    args: Any,
    kwargs: dict[str, Any],
    fragments: tuple[str, ...],
) -> None:
    for path in INSERT_PATHS:
        with pytest.raises(awa.ValidationError) as caught:
            await insert_via(path, client, sync_client, args, **kwargs)
        assert_names(caught, fragments)
    assert count_jobs(conn) == 0


@pytest.mark.parametrize(
    ("args", "kwargs", "fragments"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_INPUT if "unique_opts" not in case[2]],
)
async def test_bad_item_in_a_batch_names_its_index(
    client: awa.AsyncClient,
    sync_client: awa.Client,
    conn: Conn,
    args: Any,
    kwargs: dict[str, Any],
    fragments: tuple[str, ...],
) -> None:
    options = dict(kwargs)
    bad = awa.EnqueueRequest(args, kind=options.pop("kind", None))
    if options:
        ((name, value),) = options.items()
        bad = bad.with_opts(awa.InsertOpts(**{name.removesuffix("_opts"): value}))
    for path in INSERT_PATHS:
        with pytest.raises(awa.ValidationError, match=r"^job 2: ") as caught:
            await insert_many_via(path, client, sync_client, [Ping(), Ping(2), bad, Ping(3)])
        assert_names(caught, fragments)
    with pytest.raises(awa.ValidationError, match=r"^job 2: ") as caught:
        await client.insert_many_copy([Ping(), Ping(2), bad, Ping(3)])
    assert_names(caught, fragments)
    assert count_jobs(conn) == 0


@pytest.mark.parametrize("path", INSERT_PATHS)
async def test_limits_themselves_are_accepted(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn, path: str
) -> None:
    job = await insert_via(
        path,
        client,
        sync_client,
        {"text": "ünïcode ✓ \\u0000 is only text"},
        kind="k" * 200,
        queue="q" * 200,
        tags=[f"t{i}" for i in range(20)],
        priority=4,
        max_attempts=1000,
        run_at=dt.datetime(9999, 12, 31, 23, 59, tzinfo=dt.UTC),
        deadline_duration=dt.timedelta(days=36525),
    )
    assert count_jobs(conn, "kind = %s AND queue = %s", "k" * 200, "q" * 200) == 1
    assert len(job.tags) == 20
    assert job.deadline_duration == dt.timedelta(days=36525)
    assert count_jobs(conn, "deadline_duration = interval '36525 days'") == 1
    assert job.args == {"text": "ünïcode ✓ \\u0000 is only text"}


@pytest.mark.parametrize("path", INSERT_PATHS)
async def test_unknown_keyword_is_a_type_error(
    client: awa.AsyncClient, sync_client: awa.Client, conn: Conn, path: str
) -> None:
    with pytest.raises(TypeError, match="queu"):
        await insert_via(path, client, sync_client, Ping(), queu="mail")
    with pytest.raises(TypeError, match="priorty"):
        await insert_many_via(path, client, sync_client, [Ping()], priorty=1)
    assert count_jobs(conn) == 0


async def test_insert_many_copy_validates_too(client: awa.AsyncClient, conn: Conn) -> None:
    with pytest.raises(awa.ValidationError, match="job 1: queue"):
        await client.insert_many_copy([Ping(), awa.EnqueueRequest(Ping()).queue("")])
    with pytest.raises(TypeError, match="queu"):
        await client.insert_many_copy([Ping()], queu="x")  # type: ignore[call-arg]
    assert count_jobs(conn) == 0
