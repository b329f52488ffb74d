"""The testing harness (issue "Handler-staged follow-ups, job outputs and the testing
harness"): ``awa.testing.AwaTestClient`` and ``awa.testing.HandlerJob``.

Semantics (seed lifecycle-hooks.md: "the test harnesses behave the same way"; DESIGN §2;
semantics.md §8.3 item 14; python-api.md §6, improved on): ``work_one`` claims one job and
runs it through the runtime's executor and finalizer, so staged follow-ups are inserted on
completion and every outcome is written exactly as a worker writes it, with the client's
hooks and follow-up specs honoured. ``HandlerJob`` runs a handler without a database and
records what it staged, its progress, output and callbacks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import awa
from awa.sql import query
from awa.testing import AwaTestClient, HandlerJob, WorkResult
from awa.worker.lanes import claim_statement
from helpers_lifecycle import Counters, Recorder, jobs_of_kind, metric_reader
from helpers_worker import queue, start, wait_for
from jobs_helpers import Conn

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass
class StageA:
    item: int


@dataclasses.dataclass
class StageB:
    item_id: int


@dataclasses.dataclass
class Audit:
    item: int


@dataclasses.dataclass
class Mode:
    mode: str


@pytest.fixture(autouse=True)
def _metrics() -> None:
    metric_reader()


@pytest.fixture
def harness(client: awa.AsyncClient) -> AwaTestClient:
    return AwaTestClient(client)


async def resolve(job: awa.Job[StageA]) -> None:
    job.enqueue_on_completion(StageB(item_id=job.args.item * 10), unique_opts={})
    job.record_output({"resolved": job.args.item * 10})


# §8.3.14: work_one inserts staged follow-ups on completion -------------------------------------


async def test_work_one_completes_and_inserts_staged_follow_ups(
    harness: AwaTestClient, conn: Conn
) -> None:
    inserted = Counters.capture(
        "awa.job.staged_follow_ups_committed", **{"awa.follow_up.result": "inserted"}
    )
    trigger = await harness.insert(StageA(4), queue="stage_a")
    result = await harness.work_one(StageA, resolve)
    assert result.is_completed()
    assert result.outcome == "completed"
    assert result.error is None
    assert result.job is not None
    assert result.job.id == trigger.id
    assert result.job.state is awa.JobState.COMPLETED
    assert result.job.attempt == 1
    assert result.output == {"resolved": 40}
    assert isinstance(result.event, awa.Completed)
    assert result.event.output == {"resolved": 40}
    [follow_up] = result.follow_ups
    assert follow_up.kind == "stage_b"
    assert follow_up.args == {"item_id": 40}
    assert [row["id"] for row in jobs_of_kind(conn, "stage_b")] == [follow_up.id]
    assert inserted.delta() == 1

    second = await harness.work_one(StageB, lambda job: None)
    assert second.is_completed()
    assert second.job is not None
    assert second.job.id == follow_up.id
    assert (await harness.work_one(StageA, resolve)).is_no_job()


async def test_work_one_picks_the_kind_and_queue_asked_for(
    client: awa.AsyncClient, harness: AwaTestClient
) -> None:
    other_kind = await harness.insert(StageB(1))
    other_queue = await harness.insert(StageA(1), queue="elsewhere")
    paused = await harness.insert(StageA(2), queue="paused")
    mine = await harness.insert(StageA(3), queue="mine")
    await client.pause_queue("paused")
    result = await harness.work_one(StageA, lambda job: None, queue="mine")
    assert result.job is not None
    assert result.job.id == mine.id
    assert (await harness.work_one(StageA, lambda job: None, queue="mine")).is_no_job()
    anywhere = await harness.work_one(StageA, lambda job: None)
    assert anywhere.job is not None
    assert anywhere.job.id == other_queue.id
    assert (await harness.work_one(StageA, lambda job: None)).is_no_job()
    for job_id in (other_kind.id, paused.id):
        row = await harness.get_job(job_id)
        assert row is not None
        assert row.state is awa.JobState.AVAILABLE
    dict_job = await harness.insert({"x": 1}, kind="raw_kind")
    raw = await harness.work_one(None, lambda job: job.record_output(job.args), kind="raw_kind")
    assert raw.job is not None
    assert raw.job.id == dict_job.id
    assert raw.output == {"x": 1}


async def test_work_one_uses_the_registered_handler_by_default(
    client: awa.AsyncClient, harness: AwaTestClient
) -> None:
    @client.task(StageA, queue="stage_a")
    async def handle(job: awa.Job[StageA]) -> awa.Cancel:
        return awa.Cancel(f"item {job.args.item}")

    await harness.insert(StageA(5), queue="stage_a")
    result = await harness.work_one(StageA)
    assert result.is_cancelled()
    assert result.error == "item 5"  # as the handler gave it
    assert result.job is not None
    assert result.job.errors[-1]["error"] == "cancelled: item 5"
    with pytest.raises(awa.ValidationError, match="no handler given"):
        await harness.work_one(StageB)


# Outcomes are written exactly as the runtime writes them ------------------------------------


async def run_mode(job: awa.Job[Mode]) -> Any:
    mode = job.args.mode
    job.set_progress(40, mode)
    if mode == "output":
        job.record_output({"mode": mode})
    elif mode == "retry_after":
        return awa.RetryAfter(3600)
    elif mode == "error":
        raise ValueError("broken")
    elif mode == "terminal":
        raise awa.TerminalError("given up")
    elif mode == "cancel":
        return awa.Cancel("not needed")
    elif mode == "snooze":
        return awa.Snooze(3600)
    elif mode == "park":
        return awa.WaitForCallback(await job.register_callback(timeout_seconds=3600))
    elif mode == "stage":
        job.enqueue_on_completion(StageB(1))
    elif mode == "swallowed":
        try:
            job.enqueue_on_completion(StageB(1), priority=7)
        except awa.StagingError:
            return None
    elif mode == "bad_return":
        return awa.Snooze
    elif mode == "exhausted":
        return awa.RetryAfter(1)
    return None


MODES = {
    "complete": "completed",
    "output": "completed",
    "retry_after": "retryable",
    "error": "retryable",
    "terminal": "failed",
    "cancel": "cancelled",
    "snooze": "snoozed",
    "park": "waiting",
    "stage": "completed",
    "swallowed": "failed",
    "bad_return": "failed",
    "exhausted": "failed",
}
SETTLED = ("completed", "retryable", "failed", "cancelled", "scheduled", "waiting_external")


def comparable(row: dict[str, Any]) -> dict[str, Any]:
    """The columns an outcome writes, without times and ids that differ between two jobs."""
    return {
        "state": row["state"],
        "attempt": row["attempt"],
        "errors": [
            (entry["error"].splitlines()[0], entry["attempt"], entry.get("terminal"))
            for entry in row["errors"]
        ],
        "progress": row["progress"],
        "output": row["output"],
        "finalized": row["finalized_at"] is not None,
        "heartbeat_at": row["heartbeat_at"],
        "deadline_at": row["deadline_at"],
        "parked": row["callback_id"] is not None,
        "run_at_moved": row["run_at"] > row["created_at"],
    }


def full_row(conn: Conn, job_id: int) -> dict[str, Any]:
    cursor = conn.execute("SELECT *, state::text AS state FROM awa.jobs WHERE id = %s", (job_id,))
    assert cursor.description is not None
    names = [column.name for column in cursor.description]
    values = cursor.fetchone()
    assert values is not None
    return dict(zip(names, values, strict=True))


async def test_every_outcome_is_written_as_the_runtime_writes_it(
    client: awa.AsyncClient, harness: AwaTestClient, conn: Conn
) -> None:
    """Each mode runs once on a real worker and once through work_one: the rows agree."""
    client.task(Mode, queue="runtime")(run_mode)
    by_runtime = {
        mode: await client.insert(
            Mode(mode), queue="runtime", max_attempts=1 if mode == "exhausted" else 3
        )
        for mode in MODES
    }
    await start(client, queue("runtime", max_workers=len(MODES)))
    await wait_for(
        lambda: all(full_row(conn, job.id)["state"] in SETTLED for job in by_runtime.values()),
        message=lambda: str({m: full_row(conn, j.id)["state"] for m, j in by_runtime.items()}),
    )
    await client.shutdown()

    for mode, expected in MODES.items():
        mine = await harness.insert(
            Mode(mode), queue="harness", max_attempts=1 if mode == "exhausted" else 3
        )
        result = await harness.work_one(Mode, run_mode, queue="harness")
        assert result.outcome == expected, (mode, result)
        assert result.job is not None
        assert result.job.id == mine.id
        assert comparable(full_row(conn, mine.id)) == comparable(
            full_row(conn, by_runtime[mode].id)
        ), mode
        if expected in ("retryable", "failed", "cancelled") and mode != "retry_after":
            assert result.error is not None, mode
            stored = full_row(conn, mine.id)["errors"][-1]["error"]
            # A cancel's error is its reason as the handler gave it (the row: "cancelled: ...").
            assert stored == (
                f"cancelled: {result.error}" if expected == "cancelled" else result.error
            )
        elif mode == "retry_after":
            assert result.error is None
    assert len(jobs_of_kind(conn, "stage_b")) == 2  # one per path, from the "stage" mode


async def test_hooks_have_run_when_work_one_returns(
    client: awa.AsyncClient, harness: AwaTestClient
) -> None:
    recorder = Recorder()
    client.on_event(StageA)(recorder)
    job = await harness.insert(StageA(1))
    result = await harness.work_one(StageA, resolve)
    assert recorder.names(job.id) == ["Started", "Completed"]
    [completed] = recorder.of(awa.Completed)
    assert isinstance(result.event, awa.Completed)
    assert completed.output == result.event.output == {"resolved": 10}
    assert completed.args == StageA(1)

    await harness.insert(StageA(2))
    await harness.work_one(StageA, lambda job: awa.Cancel("stop"))
    assert [type(e).__name__ for e in recorder.events][-2:] == ["Started", "Cancelled"]


async def test_follow_up_specs_run_before_staged_follow_ups(
    client: awa.AsyncClient, harness: AwaTestClient
) -> None:
    client.on_completed_enqueue(StageA, lambda args, job: Audit(args.item))
    await harness.insert(StageA(3))
    result = await harness.work_one(StageA, resolve)
    assert [row.kind for row in result.follow_ups] == ["audit", "stage_b"]
    assert result.follow_ups[0].id < result.follow_ups[1].id


async def test_a_failing_spec_fails_the_attempt(
    client: awa.AsyncClient, harness: AwaTestClient, conn: Conn
) -> None:
    """As on a worker: the closure raises, the outcome and its follow-ups roll back, and the
    attempt is recorded as failed, with an error naming the spec."""

    def broken(args: StageA, job: awa.JobRow) -> Audit:
        raise RuntimeError("closure bug")

    client.on_completed_enqueue(StageA, broken)
    job = await harness.insert(StageA(3))
    result = await harness.work_one(StageA, resolve)
    assert result.is_retryable()
    assert result.error is not None
    assert "closure bug" in result.error
    assert "on_completed_enqueue for 'stage_a' (" in result.error
    assert result.job is not None
    assert result.job.id == job.id
    assert result.job.state is awa.JobState.RETRYABLE
    assert isinstance(result.event, awa.Retried)
    assert jobs_of_kind(conn, "stage_b") == []


async def test_a_stale_attempt_is_reported(harness: AwaTestClient, conn: Conn) -> None:
    async def cancelled_meanwhile(job: awa.Job[StageA]) -> None:
        await harness.client.cancel(job.id)
        job.enqueue_on_completion(StageB(1))

    job = await harness.insert(StageA(1))
    result = await harness.work_one(StageA, cancelled_meanwhile)
    assert result.is_stale()
    assert result.job is not None
    assert result.job.id == job.id
    assert result.job.state is awa.JobState.CANCELLED
    assert jobs_of_kind(conn, "stage_b") == []


async def test_a_handler_can_wait_for_its_callback(harness: AwaTestClient) -> None:
    tokens: asyncio.Queue[awa.CallbackToken] = asyncio.Queue()

    async def approve(job: awa.Job[StageA]) -> None:
        token = await job.register_callback(timeout_seconds=60)
        await tokens.put(token)
        payload = await job.wait_for_callback(token)
        job.enqueue_on_completion(StageB(payload["item_id"]))

    async def approver() -> None:
        token = await tokens.get()
        await wait_for(
            lambda: _waiting(harness, token),
            message="the handler never started waiting",
        )
        await harness.client.resume_external(token, {"item_id": 77})

    await harness.insert(StageA(1))
    helper = asyncio.create_task(approver())
    result = await asyncio.wait_for(harness.work_one(StageA, approve), 10)
    await helper
    assert result.is_completed()
    assert [row.args for row in result.follow_ups] == [{"item_id": 77}]


async def _waiting(harness: AwaTestClient, token: awa.CallbackToken) -> bool:
    rows = await harness.client.list_jobs(state="waiting_external")
    return any(row.callback_id == token.id for row in rows)


async def test_flushed_progress_is_stored(harness: AwaTestClient) -> None:
    seen: list[Any] = []

    async def report(job: awa.Job[StageA]) -> awa.RetryAfter:
        job.set_progress(50, "half")
        await job.flush_progress()
        row = await harness.get_job(job.id)
        assert row is not None
        seen.append(row.progress)
        return awa.RetryAfter(60)

    await harness.insert(StageA(1))
    result = await harness.work_one(StageA, report)
    assert seen == [{"percent": 50, "message": "half"}]
    assert result.is_retryable()
    assert result.job is not None
    assert result.job.progress == {"percent": 50, "message": "half"}


# drain ----------------------------------------------------------------------------------------


async def test_drain_runs_until_nothing_is_due(
    client: awa.AsyncClient, harness: AwaTestClient
) -> None:
    """A chain of staged follow-ups, a retry due at once (promoted) and a job due later:
    drain runs the first ones and leaves the last alone."""
    attempts: list[int] = []

    async def flaky(job: awa.Job[StageB]) -> awa.RetryAfter | None:
        attempts.append(job.attempt)
        return awa.RetryAfter(0) if job.attempt == 1 else None

    later = await harness.insert(StageA(9), run_at=_in_an_hour())
    await harness.insert(StageA(1))
    await asyncio.sleep(0)
    done = await harness.drain({StageA: resolve, StageB: flaky})
    outcomes = [(r.job.kind, r.outcome) for r in done if r.job is not None]
    assert outcomes[0] == ("stage_a", "completed")
    assert ("stage_b", "retryable") in outcomes
    assert outcomes[-1] == ("stage_b", "completed")
    assert attempts == [1, 2]
    row = await harness.get_job(later.id)
    assert row is not None
    assert row.state is awa.JobState.SCHEDULED
    assert await harness.drain({StageA: resolve, StageB: flaky}) == []


async def test_drain_defaults_to_the_registered_tasks_and_stops_at_max_jobs(
    client: awa.AsyncClient, harness: AwaTestClient
) -> None:
    @client.task(StageA)
    async def again(job: awa.Job[StageA]) -> awa.Snooze:
        return awa.Snooze(0)

    await harness.insert(StageA(1))
    done = await harness.drain(max_jobs=5)
    assert [r.outcome for r in done] == ["snoozed"] * 5
    with pytest.raises(awa.ValidationError):
        await AwaTestClient(awa.AsyncClient("postgresql://never-used")).drain()


def _in_an_hour() -> Any:
    import datetime as dt

    return dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)


# HandlerJob -----------------------------------------------------------------------------------


async def test_handler_job_records_what_the_handler_staged() -> None:
    """§8.3.14: no database; the staged follow-ups are those a completion would insert."""
    job = HandlerJob(StageA(item=4))
    await resolve(job)
    [staged] = job.staged
    assert staged.args == StageB(item_id=40)
    assert staged.kind == "stage_b"
    assert staged.queue == "default"
    assert staged.json_args == {"item_id": 40}
    assert staged.unique_key is not None
    assert staged.opts.unique == awa.UniqueOpts()
    assert job.output == {"resolved": 40}
    assert job.staging_error is None


async def test_handler_job_records_progress_callbacks_and_cancellation() -> None:
    async def handler(job: awa.Job[StageA]) -> Any:
        job.set_progress(30, "started")
        job.update_metadata({"step": 1})
        await job.flush_progress()
        token = await job.register_callback(timeout_seconds=60, filter="payload.ok == true")
        payload = await job.wait_for_callback(token)
        job.enqueue_on_completion(StageB(payload["id"]))
        second = await job.register_callback()
        if job.is_cancelled():
            return awa.Cancel("cancelled")
        return awa.WaitForCallback(second)

    job = HandlerJob(StageA(1), callback_payloads=[{"ok": True, "id": 5}])
    result = await job.run(handler)
    assert isinstance(result, awa.WaitForCallback)
    assert job.progress == {"percent": 30, "message": "started", "metadata": {"step": 1}}
    assert job.progress_flushes == [{"percent": 30, "message": "started", "metadata": {"step": 1}}]
    assert [c.filter for c in job.callbacks] == ["payload.ok == true", None]
    assert job.callbacks[0].timeout_seconds == 60
    assert result.token == job.callbacks[1].token
    assert [s.args for s in job.staged] == [StageB(5)]

    cancelled = HandlerJob(StageA(1), callback_payloads=[{"ok": True, "id": 5}])
    cancelled.request_cancel()
    with pytest.raises(awa.CallbackWaitError, match="cancelled"):
        await cancelled.run(handler)


async def test_handler_job_wait_errors() -> None:
    job = HandlerJob(StageA(1))
    token = await job.register_callback()
    with pytest.raises(awa.CallbackWaitError, match="no canned callback payload"):
        await job.wait_for_callback(token)
    job = HandlerJob(StageA(1), callback_payloads=["a", "b"])
    first = await job.register_callback()
    second = await job.register_callback()
    with pytest.raises(awa.CallbackWaitError, match="stale"):
        await job.wait_for_callback(first)
    assert await job.wait_for_callback(second) == "a"
    with pytest.raises(awa.CallbackWaitError, match="stale"):
        await job.wait_for_callback(second)
    with pytest.raises(awa.ValidationError, match="invalid CEL"):
        await job.register_callback(filter="payload.(")
    with pytest.raises(TypeError):
        await job.wait_for_callback("not a token")  # type: ignore[arg-type]


async def test_handler_job_run_seals_staging_like_the_runtime() -> None:
    late: list[BaseException] = []
    tasks: list[asyncio.Task[None]] = []

    async def stage_later(job: awa.Job[StageA]) -> None:
        await asyncio.sleep(0)
        try:
            job.enqueue_on_completion(StageB(2))
        except awa.StagingError as error:
            late.append(error)

    async def handler(job: awa.Job[StageA]) -> None:
        tasks.append(asyncio.create_task(stage_later(job)))

    job = HandlerJob(StageA(1))
    await job.run(handler)
    await asyncio.gather(*tasks)
    assert len(late) == 1
    assert "sealed" in str(late[0])
    assert job.staged == ()

    def sync_handler(job: awa.Job[StageA]) -> str:
        job.enqueue_on_completion(StageB(3))
        return "done"

    sync_job = HandlerJob(StageA(1))
    assert await sync_job.run(sync_handler) == "done"
    assert [s.args for s in sync_job.staged] == [StageB(3)]


def test_handler_job_mirrors_the_job_attributes() -> None:
    job = HandlerJob(
        StageA(1),
        id=9,
        queue="q",
        priority=1,
        attempt=2,
        max_attempts=3,
        tags=["t"],
        metadata={"m": 1},
        callback_result={"r": 1},
    )
    assert isinstance(job, awa.Job)
    assert (job.id, job.kind, job.queue, job.priority) == (9, "stage_a", "q", 1)
    assert (job.attempt, job.max_attempts, job.tags) == (2, 3, ["t"])
    assert job.args == StageA(1)
    assert job.raw_args == {"item": 1}
    assert job.metadata["m"] == 1
    assert job.callback_result == {"r": 1}
    assert job.state is awa.JobState.RUNNING
    assert not job.is_cancelled()
    assert HandlerJob({"a": 1}).kind == "job"
    assert HandlerJob({"a": 1}, kind="custom").kind == "custom"


def test_work_result_predicates() -> None:
    for outcome in ("completed", "retryable", "failed", "cancelled", "snoozed", "waiting"):
        result = WorkResult(outcome, None)
        checks = {
            "completed": result.is_completed(),
            "retryable": result.is_retryable(),
            "failed": result.is_failed(),
            "cancelled": result.is_cancelled(),
            "snoozed": result.is_snoozed(),
            "waiting": result.is_waiting(),
        }
        assert [name for name, value in checks.items() if value] == [outcome]
    assert WorkResult("no_job", None).is_no_job()
    assert WorkResult("no_job", None).output is None


def test_awa_testing_imports_without_pytest() -> None:
    code = "import sys, awa.testing; assert 'pytest' not in sys.modules; print('ok')"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# The pytest fixtures ---------------------------------------------------------------------------


def documented_pytest_example() -> str:
    """The test module shown in docs/testing.md (the block starting with its file name)."""
    text = (ROOT / "docs" / "testing.md").read_text()
    for block in re.findall(r"```python\n(.*?)```", text, re.DOTALL):
        if block.startswith("# test_signup.py"):
            return str(block)
    raise AssertionError("docs/testing.md has no '# test_signup.py' example")


def test_the_fixture_module_runs_the_documented_example(database_url: str, tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["awa.testing_fixtures"]\n')
    (tmp_path / "test_signup.py").write_text(documented_pytest_example())
    env = {**os.environ, "AWA_TEST_DATABASE_URL": database_url}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"\b[1-9]\d* passed", result.stdout), result.stdout


def test_the_claim_of_work_one_returns_the_columns_of_the_runtimes_claim() -> None:
    """Job.from_claim reads both; they must list the same columns in the same order, with
    the same changes to the row."""
    claim_jobs = claim_statement((2,), 256)

    def returning(text: str) -> str:
        return " ".join(text[text.index("RETURNING") :].split())

    def sets(text: str) -> str:
        return " ".join(text[text.index("SET state") : text.index("WHERE j.id")].split())

    assert returning(query("claim_one")) == returning(claim_jobs)
    assert sets(query("claim_one")) == sets(claim_jobs)
