"""resolve_callback and its CEL expressions (semantics.md §6.4 and §8.5, cases C1-C17).

The decision: no expressions -> the default action; otherwise ``filter`` false -> ignore
(an error or a non-boolean counts as true: it fails open), then ``on_fail`` true -> fail,
then ``on_complete`` true -> complete with ``transform(payload)`` (the payload itself when
the transform errors or has no JSON form); errors in on_fail / on_complete count as false;
nothing matched -> the default action. Expressions are checked when registered and may
refer to ``payload`` only.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

import awa
from awa.callbacks import cel
from helpers_callbacks import QUEUE, Payment, insert_parked, last_error, wait_parked
from helpers_lifecycle import Recorder
from helpers_worker import queue, row, second_client, start, wait_for_state
from jobs_helpers import Conn

# The decision procedure alone (no database) ---------------------------------------------------


def decide(payload: Any, default: cel.Action = "ignore", **expressions: str) -> cel.Decision:
    return cel.decide(
        payload,
        default,
        filter=expressions.get("filter"),
        on_complete=expressions.get("on_complete"),
        on_fail=expressions.get("on_fail"),
        transform=expressions.get("transform"),
    )


def test_no_expressions_apply_the_default_action() -> None:
    assert decide({"a": 1}, "complete") == cel.Decision("complete", payload={"a": 1})
    assert decide({"a": 1}, "fail") == cel.Decision("fail", error="callback failed: default action")
    assert decide({"a": 1}) == cel.Decision(
        "ignore", reason="no expressions configured, default is ignore"
    )


@pytest.mark.parametrize(
    ("filter", "outcome"),
    [
        ('payload.status != "test"', "ignore"),  # false: ignored
        ('payload.status == "test"', "complete"),
        ("payload.missing == 1", "complete"),  # runtime error: fails open
        ("payload.status", "complete"),  # not a boolean: fails open
        ("payload.(", "complete"),  # does not compile: fails open
    ],
)
def test_filter_fails_open(filter: str, outcome: str) -> None:
    decision = decide({"status": "test"}, "ignore", filter=filter, on_complete="true")
    assert decision.action == outcome
    if outcome == "ignore":
        assert decision.reason == "filter expression returned false"


def test_fail_takes_precedence_over_complete() -> None:
    decision = decide({}, "complete", on_fail="true", on_complete="true")
    assert decision == cel.Decision(
        "fail", error="callback failed: on_fail expression matched", expression="true"
    )


@pytest.mark.parametrize("broken", ["payload.nope > 1", "payload.(", "1 / 0 == 1", "'text'"])
def test_errors_in_conditions_count_as_false(broken: str) -> None:
    assert decide({"a": 1}, "ignore", on_fail=broken).action == "ignore"
    assert decide({"a": 1}, "ignore", on_complete=broken).action == "ignore"
    assert decide({"a": 1}, "complete", on_fail=broken).action == "complete"


@pytest.mark.parametrize(
    ("transform", "expected"),
    [
        ("int(payload.amount_cents) / 100", 42),
        ("double(payload.amount_cents) * 0.5", 2100.0),
        ('payload.id + "_x"', "ch_1_x"),
        ("1.0 / 0.0", {"amount_cents": 4200, "id": "ch_1"}),  # infinite: the payload
        ('"nul \\u0000 byte"', {"amount_cents": 4200, "id": "ch_1"}),  # not storable
        (
            '{"id": payload.id, "ok": true, "tags": [1, "x", null]}',
            {"id": "ch_1", "ok": True, "tags": [1, "x", None]},
        ),
        ("payload.nope", {"amount_cents": 4200, "id": "ch_1"}),  # error: the payload itself
        ('b"bytes"', {"amount_cents": 4200, "id": "ch_1"}),  # no JSON form: the payload
        ('timestamp("2024-01-01T00:00:00Z")', {"amount_cents": 4200, "id": "ch_1"}),
    ],
)
def test_transform_falls_back_to_the_payload(transform: str, expected: Any) -> None:
    payload = {"amount_cents": 4200, "id": "ch_1"}
    decision = decide(payload, "ignore", on_complete="true", transform=transform)
    assert decision.action == "complete"
    assert decision.payload == expected


def test_payload_none_is_json_null() -> None:
    assert decide(None, "ignore", on_complete="payload == null").action == "complete"


@pytest.mark.parametrize(
    "source",
    [
        'payload.status == "ok"',
        "has(payload.charge) && payload.charge.amount > 0",
        "payload.items.exists(i, i.sku == 'a')",
        "payload.items.all(i, i.qty > 0)",
        "payload.items.map(i, i.qty).size() > 1",
        "size(payload) > 0",
        "payload.x in [1, 2, 3]",
        "payload.name.startsWith('ab')",
        "true",
        "int(payload.amount_cents) / 100",
    ],
)
def test_valid_expressions_pass_the_check(source: str) -> None:
    assert cel.check_expression("filter", source) == source
    assert cel.check_expression("filter", None) is None


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("payload.status ==", "invalid CEL expression for on_fail"),
        ("request.body == 1", "refers to request"),
        ("payload.a && other", "refers to other"),
        ("payload.items.exists(i, i > limit)", "refers to limit"),
        ("", "non-empty"),
        ("   ", "non-empty"),
    ],
)
def test_invalid_expressions_are_rejected(source: str, message: str) -> None:
    with pytest.raises(awa.ValidationError, match="invalid CEL expression for on_fail") as info:
        cel.check_expression("on_fail", source)
    assert message in str(info.value)


# resolve_callback against the database (C1-C17) ------------------------------------------------


async def test_c1_no_expressions_default_complete(client: awa.AsyncClient, conn: Conn) -> None:
    job_id, cb = await insert_parked(client, conn)
    result = await client.resolve_callback(cb, {"status": "ok"}, "complete")
    assert result.outcome == "completed"
    assert result.payload == {"status": "ok"}
    assert result.job is not None
    assert result.job.output == {"status": "ok"}
    assert row(conn, job_id)["state"] == "completed"


async def test_c2_no_expressions_default_ignore(client: awa.AsyncClient, conn: Conn) -> None:
    job_id, cb = await insert_parked(client, conn)
    result = await client.resolve_callback(cb, {"status": "ok"})
    assert result.is_ignored()
    assert result.reason == "no expressions configured, default is ignore"
    db = row(conn, job_id)
    assert db["state"] == "waiting_external"
    assert str(db["callback_id"]) == cb


async def test_default_fail(client: awa.AsyncClient, conn: Conn) -> None:
    job_id, cb = await insert_parked(client, conn)
    result = await client.resolve_callback(cb, None, "fail")
    assert result.is_failed()
    entry = last_error(conn, job_id)
    assert entry["error"] == "callback failed: default action"
    assert "expression" not in entry
    assert row(conn, job_id)["state"] == "failed"


async def test_c3_filter_false_ignores(client: awa.AsyncClient, conn: Conn) -> None:
    job_id, cb = await insert_parked(
        client, conn, filter='payload.status != "test"', on_complete="true"
    )
    result = await client.resolve_callback(cb, {"status": "test"}, "complete")
    assert result.is_ignored()
    assert result.reason == "filter expression returned false"
    assert row(conn, job_id)["state"] == "waiting_external"


async def test_c4_filter_passes_and_on_complete_matches(
    client: awa.AsyncClient, conn: Conn
) -> None:
    job_id, cb = await insert_parked(
        client,
        conn,
        filter='payload.status != "test"',
        on_complete='payload.event == "charge.succeeded"',
    )
    result = await client.resolve_callback(cb, {"status": "live", "event": "charge.succeeded"})
    assert result.is_completed()
    assert row(conn, job_id)["state"] == "completed"


async def test_c5_on_fail_matches(client: awa.AsyncClient, conn: Conn) -> None:
    source = 'payload.event == "charge.failed"'
    job_id, cb = await insert_parked(client, conn, on_fail=source)
    result = await client.resolve_callback(cb, {"event": "charge.failed"})
    assert result.is_failed()
    assert result.job is not None
    assert result.job.state is awa.JobState.FAILED
    entry = last_error(conn, job_id)
    assert entry["error"] == "callback failed: on_fail expression matched"
    assert entry["expression"] == source
    assert entry["terminal"] is True


async def test_c6_fail_takes_precedence(client: awa.AsyncClient, conn: Conn) -> None:
    job_id, cb = await insert_parked(client, conn, on_fail="true", on_complete="true")
    assert (await client.resolve_callback(cb, {}, "complete")).is_failed()
    assert row(conn, job_id)["state"] == "failed"


async def test_c7_transform(client: awa.AsyncClient, conn: Conn) -> None:
    job_id, cb = await insert_parked(
        client, conn, on_complete="true", transform="int(payload.amount_cents) / 100"
    )
    result = await client.resolve_callback(cb, {"amount_cents": 4200})
    assert result.is_completed()
    assert result.payload == 42
    assert row(conn, job_id)["output"] == 42  # the transformed payload is the output


async def test_c8_invalid_filter_fails_open(client: awa.AsyncClient, conn: Conn) -> None:
    job_id, cb = await insert_parked(client, conn, filter="this is not CEL", on_complete="true")
    assert (await client.resolve_callback(cb, {"x": 1})).is_completed()
    assert row(conn, job_id)["state"] == "completed"


async def test_c9_invalid_transform_keeps_the_payload(client: awa.AsyncClient, conn: Conn) -> None:
    _, cb = await insert_parked(client, conn, on_complete="true", transform="payload.(")
    result = await client.resolve_callback(cb, {"keep": "me"})
    assert result.is_completed()
    assert result.payload == {"keep": "me"}


async def test_c10_nothing_matches_default_ignore(client: awa.AsyncClient, conn: Conn) -> None:
    job_id, cb = await insert_parked(
        client, conn, on_complete='payload.s == "ok"', on_fail='payload.s == "bad"'
    )
    result = await client.resolve_callback(cb, {"s": "pending"})
    assert result.is_ignored()
    assert result.reason == "no expressions configured, default is ignore"
    assert row(conn, job_id)["state"] == "waiting_external"


async def test_c10_nothing_matches_default_complete(client: awa.AsyncClient, conn: Conn) -> None:
    _, cb = await insert_parked(client, conn, on_fail='payload.s == "bad"', transform="1")
    result = await client.resolve_callback(cb, {"s": "pending"}, "complete")
    assert result.is_completed()
    assert result.payload == {"s": "pending"}  # the transform belongs to on_complete


async def test_c11_invalid_expression_at_registration(client: awa.AsyncClient, conn: Conn) -> None:
    """The handler's register_callback raises ValidationError naming the expression; the
    attempt fails with it when the handler lets it out."""

    @client.task(Payment, queue=QUEUE)
    async def pay(job: awa.Job[Payment]) -> awa.WaitForCallback:
        token = await job.register_callback(on_complete="payload.status = 'ok'")
        return awa.WaitForCallback(token)

    job = await client.insert(Payment(), queue=QUEUE, max_attempts=1)
    await start(client, queue(QUEUE))

    await wait_for_state(conn, job.id, "failed")
    assert "invalid CEL expression for on_complete" in last_error(conn, job.id)["error"]
    assert row(conn, job.id)["callback_id"] is None


async def test_c12_resolving_twice(client: awa.AsyncClient, conn: Conn) -> None:
    _, cb = await insert_parked(client, conn, on_complete="true")
    assert (await client.resolve_callback(cb, {})).is_completed()
    with pytest.raises(awa.CallbackNotFound):
        await client.resolve_callback(cb, {})


async def test_c13_migrations_are_idempotent(client: awa.AsyncClient) -> None:
    assert await client.migrate() == []


async def test_c14_nested_payload(client: awa.AsyncClient, conn: Conn) -> None:
    _, cb = await insert_parked(
        client, conn, on_complete='payload.data.charge.status == "succeeded"'
    )
    payload = {"data": {"charge": {"status": "succeeded", "id": "ch_1"}}}
    assert (await client.resolve_callback(cb, payload)).is_completed()


async def test_c15_missing_field_counts_as_false(client: awa.AsyncClient, conn: Conn) -> None:
    job_id, cb = await insert_parked(client, conn, on_complete='payload.nope == "x"')
    assert (await client.resolve_callback(cb, {"other": 1})).is_ignored()
    assert row(conn, job_id)["state"] == "waiting_external"


async def test_c16_resolve_accepts_a_running_job(client: awa.AsyncClient, conn: Conn) -> None:
    job_id, cb = await insert_parked(client, conn, state="running", on_complete="true")
    assert (await client.resolve_callback(cb, {})).is_completed()
    assert row(conn, job_id)["state"] == "completed"


async def test_c17_concurrent_resolves(
    client: awa.AsyncClient, database_url: str, conn: Conn
) -> None:
    for _ in range(5):
        job_id, cb = await insert_parked(client, conn, on_complete="payload.ok")
        async with second_client(database_url) as one, second_client(database_url) as two:
            results = await asyncio.gather(
                one.resolve_callback(cb, {"ok": True}),
                two.resolve_callback(cb, {"ok": True}),
                return_exceptions=True,
            )
        assert sum(isinstance(r, awa.ResolveResult) and r.is_completed() for r in results) == 1
        assert sum(isinstance(r, awa.CallbackNotFound) for r in results) == 1
        assert row(conn, job_id)["state"] == "completed"


async def test_expressions_registered_by_the_handler(client: awa.AsyncClient, conn: Conn) -> None:
    """Through the worker: register_callback stores the four expressions, resolve_callback
    decides with them, and the Completed event carries the transformed payload."""

    @dataclasses.dataclass
    class Charge:
        amount_cents: int

    recorder = Recorder()
    client.on_event(Charge, recorder)

    @client.task(Charge, queue=QUEUE)
    async def charge(job: awa.Job[Charge]) -> awa.WaitForCallback:
        token = await job.register_callback(
            filter="payload.livemode == true",
            on_fail='payload.type == "charge.failed"',
            on_complete='payload.type == "charge.succeeded"',
            transform='{"charged": payload.data.amount}',
        )
        return awa.WaitForCallback(token)

    await start(client, queue(QUEUE))
    jobs = [await client.insert(Charge(100), queue=QUEUE) for _ in range(3)]
    callbacks = [await wait_parked(conn, job.id) for job in jobs]
    db = row(conn, jobs[0].id)
    assert db["callback_filter"] == "payload.livemode == true"
    assert db["callback_transform"] == '{"charged": payload.data.amount}'
    test_mode = {"livemode": False, "type": "charge.succeeded", "data": {"amount": 100}}
    assert (await client.resolve_callback(callbacks[0], test_mode, "fail")).is_ignored()
    succeeded = {"livemode": True, "type": "charge.succeeded", "data": {"amount": 100}}
    result = await client.resolve_callback(callbacks[0], succeeded)
    assert result.payload == {"charged": 100}
    [completed] = recorder.of(awa.Completed, jobs[0].id)
    assert completed.output == {"charged": 100}
    failed = {"livemode": True, "type": "charge.failed", "data": {"amount": 100}}
    assert (await client.resolve_callback(callbacks[1], failed)).is_failed()
    [exhausted] = recorder.of(awa.Exhausted, jobs[1].id)
    assert exhausted.error == "callback failed: on_fail expression matched"
    pending = {"livemode": True, "type": "charge.pending"}
    assert (await client.resolve_callback(callbacks[2], pending)).is_ignored()
    assert row(conn, jobs[2].id)["state"] == "waiting_external"
