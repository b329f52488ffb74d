"""Traces across jobs (``awa.observability.tracing``): the scenario runs in a process of its own
with an in-memory span exporter (tests/procs/trace_scenario.py); these tests read its spans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psycopg
import pytest

import awa
from awa.observability.tracing import TRACEPARENT, with_traceparent
from jobs_helpers import Conn

SCENARIO = Path(__file__).parent / "procs" / "trace_scenario.py"

Span = dict[str, Any]


@pytest.fixture(scope="module")
def spans(session_database: str) -> list[Span]:
    """The scenario's spans, run once for the tests of this module (on emptied tables)."""
    with psycopg.connect(session_database, autocommit=True) as conn:
        conn.execute("DELETE FROM awa.jobs; DELETE FROM awa.runtimes")
    result = subprocess.run(
        [sys.executable, str(SCENARIO)],
        env={**os.environ, "DATABASE_URL": session_database},
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def named(spans: list[Span], name: str) -> list[Span]:
    found = [span for span in spans if span["name"] == name]
    assert found, f"no span {name!r} in {[span['name'] for span in spans]}"
    return found


def parent_of(spans: list[Span], span: Span) -> Span:
    [parent] = [other for other in spans if other["id"] == span["parent"]]
    return parent


def test_one_trace_from_the_request_to_the_follow_ups(spans: list[Span]) -> None:
    [request] = named(spans, "signup request")
    [signup] = named(spans, "job.execute signup")
    send = parent_of(spans, signup)
    assert (send["name"], send["kind"]) == ("send t", "PRODUCER")
    assert parent_of(spans, send) == request
    assert signup["kind"] == "CONSUMER"
    assert signup["attributes"]["awa.job.kind"] == "signup"
    assert signup["attributes"]["awa.job.queue"] == "t"
    assert signup["attributes"]["awa.job.outcome"] == "completed"
    # The follow-up of a registered spec and the one the handler staged: children of the
    # attempt that produced them, in the request's trace.
    [welcome] = named(spans, "job.execute welcome")
    receipts = named(spans, "job.execute receipt")
    assert welcome["parent"] == signup["id"]
    assert signup["id"] in {receipt["parent"] for receipt in receipts}
    assert {span["trace"] for span in (request, send, signup, welcome)} == {request["trace"]}


def test_a_retry_is_in_the_same_trace(spans: list[Span]) -> None:
    first, second = sorted(
        named(spans, "job.execute flaky"), key=lambda span: span["attributes"]["awa.job.attempt"]
    )
    assert (first["attributes"]["awa.job.attempt"], second["attributes"]["awa.job.attempt"]) == (
        1,
        2,
    )
    assert first["trace"] == second["trace"] == named(spans, "signup request")[0]["trace"]
    assert first["parent"] == second["parent"]  # the insert's span (in a transaction)
    assert (first["status"], first["events"]) == ("ERROR", ["exception"])
    assert first["attributes"]["awa.job.outcome"] == "retry"
    assert (second["status"], second["attributes"]["awa.job.outcome"]) == ("UNSET", "completed")


def test_a_def_handlers_staged_follow_up_is_its_child(spans: list[Span]) -> None:
    [report] = named(spans, "job.execute report")
    assert any(receipt["parent"] == report["id"] for receipt in named(spans, "job.execute receipt"))


def test_a_callback_resolution_carries_the_resolvers_context(spans: list[Span]) -> None:
    [webhook] = named(spans, "payment webhook")
    [resolve] = named(spans, "awa.callback.resolve")
    [notify] = named(spans, "job.execute notify")
    assert resolve["parent"] == webhook["id"]
    assert notify["parent"] == resolve["id"]
    assert notify["trace"] == webhook["trace"]


def test_the_traceparent_goes_into_the_metadata() -> None:
    assert with_traceparent("{}") == "{}"  # no active span
    # With an active span (a context carried by hand, as the worker does for follow-ups).
    from awa.observability.tracing import continuing

    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with continuing(parent):
        assert json.loads(with_traceparent("{}")) == {TRACEPARENT: parent}
        assert json.loads(with_traceparent('{"a":1}')) == {TRACEPARENT: parent, "a": 1}
        mine = '{"awa:traceparent":"00-11111111111111111111111111111111-2222222222222222-01"}'
        assert with_traceparent(mine) == mine  # the caller's wins


async def test_no_span_no_metadata(client: awa.AsyncClient, conn: Conn) -> None:
    job = await client.insert({"n": 1}, kind="plain")
    row = conn.execute("SELECT metadata FROM awa.jobs WHERE id = %s", (job.id,)).fetchone()
    assert row == ({},)


def test_capture_can_be_turned_off(database_url: str) -> None:
    script = textwrap.dedent(
        """
        import asyncio
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        import awa

        trace.set_tracer_provider(TracerProvider())

        async def main():
            async with awa.AsyncClient() as client:
                with trace.get_tracer("t").start_as_current_span("request"):
                    job = await client.insert({"n": 1}, kind="plain")
                print(sorted((await client.get_job(job.id)).metadata))

        asyncio.run(main())
        """
    )
    env = {**os.environ, "DATABASE_URL": database_url}
    on = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert on.stdout.strip() == "['awa:traceparent']", on.stderr
    off = subprocess.run(
        [sys.executable, "-c", script],
        env={**env, "AWA_TRACE_CAPTURE": "off"},
        capture_output=True,
        text=True,
    )
    assert off.stdout.strip() == "[]", off.stderr
