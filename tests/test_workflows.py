"""Dependencies, workflows, batches and waiting for a result, against the real database."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

import psycopg
import pytest

import awa
from awa.ui import create_app
from helpers_ui import browse, text
from helpers_worker import queue, start, wait_for
from jobs_helpers import Conn, job_row, must_job_row, set_state


@dataclasses.dataclass
class Step:
    name: str
    fail: bool = False


def register(client: awa.AsyncClient, log: list[tuple[str, float]]) -> None:
    @client.task(Step)
    async def run(job: awa.Job[Step]) -> None:
        log.append((job.args.name, time.monotonic()))
        await asyncio.sleep(0.02)
        if job.args.fail:
            raise awa.TerminalError(f"{job.args.name} fails")


def diamond(fail_b: bool = False, policy: str = "cancel") -> tuple[awa.Workflow, list[awa.Step]]:
    wf = awa.Workflow("diamond")
    a = wf.add(Step("a"))
    b = wf.add(Step("b", fail=fail_b), depends_on=[a])
    c = wf.add(Step("c"), depends_on=[a])
    d = wf.add(Step("d"), depends_on=[b, c], on_dependency_failure=policy)
    return wf, [a, b, c, d]


async def test_a_diamond_runs_in_dependency_order(client: awa.AsyncClient, conn: Conn) -> None:
    log: list[tuple[str, float]] = []
    register(client, log)
    wf, (a, b, c, d) = diamond()
    run = await client.insert_workflow(wf)
    assert [job.state for job in run.jobs] == [
        awa.JobState.AVAILABLE,
        awa.JobState.BLOCKED,
        awa.JobState.BLOCKED,
        awa.JobState.BLOCKED,
    ]
    await start(client, queue("default", 4))
    final = await client.wait(run[d].id, timeout=10)
    assert final.state is awa.JobState.COMPLETED
    names = [name for name, _ in log]
    assert names[0] == "a"
    assert names[-1] == "d"
    assert sorted(names[1:3]) == ["b", "c"]
    rows = {step: must_job_row(conn, run[step].id) for step in (b, c, d)}
    # D's attempt started after both B and C had committed their completion.
    assert rows[d]["attempted_at"] > max(rows[b]["finalized_at"], rows[c]["finalized_at"])
    info = await client.get_workflow(run.id)
    assert info.name == "diamond"
    assert info.states() == {"completed": 4}
    assert [entry.depends_on for entry in info.jobs] == [
        [],
        [run[a].id],
        [run[a].id],
        [run[b].id, run[c].id],
    ]
    assert run[d].metadata["awa:workflow"] == {"id": str(run.id), "name": "diamond", "step": 3}


async def test_policy_cancel_cancels_the_child_and_its_descendants(
    client: awa.AsyncClient, conn: Conn
) -> None:
    register(client, [])
    cancelled: list[awa.Cancelled[Any]] = []
    client.on_event(
        Step, lambda event: cancelled.append(event) if isinstance(event, awa.Cancelled) else None
    )
    wf, (_a, b, c, d) = diamond(fail_b=True)
    e = wf.add(Step("e"), depends_on=[d])
    run = await client.insert_workflow(wf)
    await start(client, queue("default", 4))
    final = await client.wait(run[e].id, timeout=10)
    assert final.state is awa.JobState.CANCELLED
    d_row = must_job_row(conn, run[d].id)
    assert d_row["state"] == "cancelled"
    assert d_row["errors"][-1]["error"] == (
        f"cancelled: dependency {run[b].id} (step) ended failed"
    )
    assert final.errors[-1]["error"] == f"cancelled: dependency {run[d].id} (step) ended cancelled"
    # C ran beside B and is not cancelled (it may still be finishing when E is cancelled).
    assert (await client.wait(run[c].id, timeout=10)).state is awa.JobState.COMPLETED
    # The worker that failed B fires Cancelled for the dependents cancelled with it.
    await wait_for(lambda: len(cancelled) == 2, message=lambda: f"{cancelled}")
    assert sorted(event.job.id for event in cancelled) == [run[d].id, run[e].id]


async def test_policy_run_runs_the_child_anyway(client: awa.AsyncClient, conn: Conn) -> None:
    log: list[tuple[str, float]] = []
    register(client, log)
    wf, (_, _, _, d) = diamond(fail_b=True, policy="run")
    run = await client.insert_workflow(wf)
    await start(client, queue("default", 4))
    assert (await client.wait(run[d].id, timeout=10)).state is awa.JobState.COMPLETED
    assert "d" in [name for name, _ in log]


async def test_policy_wait_keeps_the_child_until_the_parent_is_retried(
    client: awa.AsyncClient, conn: Conn
) -> None:
    log: list[tuple[str, float]] = []

    @client.task(Step)
    async def run_step(job: awa.Job[Step]) -> None:
        log.append((job.args.name, time.monotonic()))
        if job.args.fail and job.attempt == 1 and not log_flags["fixed"]:
            raise awa.TerminalError("not yet")

    log_flags = {"fixed": False}
    parent = await client.insert(Step("p", fail=True))
    child = await client.insert(Step("child"), depends_on=[parent], on_dependency_failure="wait")
    assert child.state is awa.JobState.BLOCKED
    await start(client, queue("default", 2))
    await wait_for(lambda: must_job_row(conn, parent.id)["state"] == "failed")
    await asyncio.sleep(0)  # the child must still be blocked: nothing more happens
    assert must_job_row(conn, child.id)["state"] == "blocked"
    log_flags["fixed"] = True
    await client.retry(parent.id)  # the operator acts
    assert (await client.wait(child.id, timeout=10)).state is awa.JobState.COMPLETED


async def test_dependencies_on_existing_jobs(client: awa.AsyncClient, conn: Conn) -> None:
    done = await client.insert(Step("done"))
    set_state(conn, done.id, "completed", finalized_at=dt.datetime.now(dt.UTC))
    failed = await client.insert(Step("failed"))
    set_state(conn, failed.id, "failed", finalized_at=dt.datetime.now(dt.UTC))
    ready = await client.insert(Step("x"), depends_on=[done])
    assert ready.state is awa.JobState.AVAILABLE  # every parent is done already
    gone = await client.insert(Step("y"), depends_on=[done, failed])
    assert gone.state is awa.JobState.CANCELLED
    runs = await client.insert(Step("z"), depends_on=[failed], on_dependency_failure="run")
    assert runs.state is awa.JobState.AVAILABLE
    later = await client.insert(
        Step("w"), depends_on=[done], run_at=dt.datetime(2099, 1, 1, tzinfo=dt.UTC)
    )
    assert later.state is awa.JobState.SCHEDULED
    with pytest.raises(awa.ValidationError, match="do not exist"):
        await client.insert(Step("orphan"), depends_on=[done.id, 999_999])
    with pytest.raises(awa.ValidationError, match="on_dependency_failure"):
        await client.insert(Step("bad"), depends_on=[done], on_dependency_failure="maybe")
    with pytest.raises(awa.ValidationError, match="depends_on"):
        await client.insert(Step("bad"), depends_on=["x"])  # type: ignore[list-item]
    with pytest.raises(awa.ValidationError, match="depends_on"):
        await client.insert_many_copy([Step("bad")], depends_on=[done])
    assert conn.execute(
        "SELECT count(*) FROM awa.jobs WHERE args->>'name' IN ('orphan', 'bad')"
    ).fetchone() == (0,)


async def test_a_parent_completing_on_the_batched_path_releases_its_children(
    client: awa.AsyncClient, conn: Conn
) -> None:
    @client.task(Step)
    async def quick(job: awa.Job[Step]) -> None:
        return None  # completions are committed in batches

    parents = await client.insert_many([Step(f"p{n}") for n in range(50)])
    children = [
        await client.insert(Step(f"c{n}"), depends_on=[parent]) for n, parent in enumerate(parents)
    ]
    fan_in = await client.insert(Step("all"), depends_on=parents)
    await start(client, queue("default", 8))
    finished = await client.wait_many([child.id for child in children] + [fan_in.id], timeout=15)
    assert {row.state for row in finished.values()} == {awa.JobState.COMPLETED}


async def test_wait_returns_at_the_commit_and_times_out_cleanly(
    client: awa.AsyncClient, conn: Conn
) -> None:
    job = await client.insert(Step("later"), queue="nobody")
    started = time.monotonic()
    with pytest.raises(awa.WaitTimeout, match=r"did not finish within 0\.2 s"):
        await client.wait(job.id, timeout=0.2)
    assert 0.2 <= time.monotonic() - started < 2
    assert must_job_row(conn, job.id)["state"] == "available"  # untouched

    async def finish_later() -> float:
        await asyncio.sleep(0.1)
        with conn.transaction():
            set_state(conn, job.id, "completed", finalized_at=dt.datetime.now(dt.UTC))
        return time.monotonic()

    finisher = asyncio.create_task(finish_later())
    row = await client.wait(job.id, timeout=10)
    woken = time.monotonic()
    committed = await finisher
    assert row.state is awa.JobState.COMPLETED
    assert woken - committed < 0.5  # a notification, not a poll
    again = await client.wait(job.id, timeout=0)  # finished already: at once
    assert again.id == job.id
    with pytest.raises(awa.ValidationError, match="no job 424242"):
        await client.wait(424242)


async def test_wait_sees_a_completion_that_commits_while_it_marks_the_job(
    client: awa.AsyncClient, conn: Conn, database_url: str
) -> None:
    """The job moves to the completed jobs' table while wait is flagging it in the running
    jobs' table: wait still learns of the completion (it looks again in the new home)."""
    job = await client.insert(Step("racing"), queue="nobody")
    set_state(conn, job.id, "running", attempted_at=dt.datetime.now(dt.UTC))
    with psycopg.connect(database_url) as finisher:
        set_state(finisher, job.id, "completed", finalized_at=dt.datetime.now(dt.UTC))
        waiter = asyncio.create_task(client.wait(job.id, timeout=5))

        def watch_blocked() -> bool:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND query LIKE %s",
                ("%watch_jobs%",),
            ).fetchone()
            return row is not None and row[0] == 1

        await wait_for(watch_blocked, message="wait never blocked on the completing job")
        finisher.commit()
        row = await waiter
    assert row.state is awa.JobState.COMPLETED


def test_blocking_wait(sync_client: awa.Client, conn: Conn) -> None:
    job = sync_client.insert(Step("s"), queue="nobody")
    with pytest.raises(awa.WaitTimeout):
        sync_client.wait(job.id, timeout=0.1)
    set_state(conn, job.id, "cancelled", finalized_at=dt.datetime.now(dt.UTC))
    assert sync_client.wait_many([job.id], timeout=5)[job.id].state is awa.JobState.CANCELLED


async def test_a_workflow_in_a_rolled_back_transaction_leaves_nothing(
    client: awa.AsyncClient, conn: Conn
) -> None:
    wf, _ = diamond()

    async def insert_then_change_mind() -> None:
        async with client.transaction() as tx:
            run = await tx.insert_workflow(wf)
            assert len(run.jobs) == 4
            raise RuntimeError("changed my mind")

    with pytest.raises(RuntimeError, match="changed my mind"):
        await insert_then_change_mind()
    assert conn.execute("SELECT count(*) FROM awa.jobs").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM awa.job_dependencies").fetchone() == (0,)


async def test_a_batch_runs_its_fan_in_once_with_the_counts(
    client: awa.AsyncClient, conn: Conn
) -> None:
    seen: list[dict[str, Any]] = []

    @client.task(Step)
    async def member(job: awa.Job[Step]) -> None:
        if job.args.name == "summary":
            seen.append(job.metadata["awa:batch"])
        elif job.args.fail:
            raise awa.TerminalError("member fails")

    batch = await client.insert_batch(
        [Step(f"m{n}", fail=n % 4 == 0) for n in range(20)], on_complete=Step("summary")
    )
    assert batch.fan_in.state is awa.JobState.BLOCKED
    await start(client, queue("default", 4))
    await client.wait(batch.fan_in.id, timeout=10)
    assert len(seen) == 1
    assert seen[0]["counts"] == {"completed": 15, "failed": 5}
    assert sorted(seen[0]["ids"]["failed"]) == [batch.members[n].id for n in range(0, 20, 4)]
    info = await client.get_workflow(batch.id)
    assert info.states() == {"completed": 16, "failed": 5}


def test_cancel_workflow_and_the_cli(sync_client: awa.Client, database_url: str) -> None:
    wf, _ = diamond()
    run = sync_client.insert_workflow(wf)
    env = {**os.environ, "DATABASE_URL": database_url}
    shown = subprocess.run(
        [sys.executable, "-m", "awa", "workflow", "get", str(run.id), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    listed = json.loads(shown.stdout)
    assert listed["name"] == "diamond"
    assert listed["states"] == {"available": 1, "blocked": 3}
    assert listed["jobs"][3]["depends_on"] == [run.jobs[1].id, run.jobs[2].id]
    cancelled = subprocess.run(
        [sys.executable, "-m", "awa", "workflow", "cancel", str(run.id)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert cancelled.stdout.strip() == "cancelled 4 job(s)"
    assert sync_client.get_workflow(run.id).states() == {"cancelled": 4}
    assert sync_client.cancel_workflow(run.id) == 0
    with pytest.raises(awa.ValidationError, match="UUID"):
        sync_client.get_workflow("not-a-uuid")


async def test_the_ui_shows_a_workflow_and_a_job_s_dependencies(
    client: awa.AsyncClient, conn: Conn
) -> None:
    wf, (_a, b, _c, d) = diamond()
    run = await client.insert_workflow(wf)
    async with browse(create_app(client)) as http:
        page = await http.get(f"/workflows/{run.id}")
        assert page.status_code == 200
        body = text(page)
        assert "Workflow diamond" in body
        assert "1 available, 3 blocked" in body
        job = await http.get(f"/jobs/{run[d].id}")
        assert re.search(rf'class="workflow-link" href="[^"]*/workflows/{run.id}"', job.text)
        assert f"job {run[b].id} (step)" in text(job)
        assert "unsettled; if it fails: cancel" in text(job)
        blocked = await http.get("/jobs", params={"state": "blocked"})
        assert str(run[d].id) in blocked.text
        assert (await http.get("/workflows/nope")).status_code == 400


async def test_admin_and_maintenance_handle_blocked_jobs(
    client: awa.AsyncClient, conn: Conn
) -> None:
    register(client, [])
    parent = await client.insert(Step("p"), queue="q")
    child = await client.insert(Step("c"), depends_on=[parent], queue="q")
    assert await client.drain_queue("q") == 2
    assert must_job_row(conn, child.id)["state"] == "cancelled"
    # Retention deletes the child; the leader prunes its edges.
    conn.execute("DELETE FROM awa.jobs WHERE id = %s", (child.id,))
    await start(client, queue("q"), cleanup_interval=0.05)
    await wait_for(
        lambda: conn.execute("SELECT count(*) FROM awa.job_dependencies").fetchone() == (0,)
    )
    # An operator deleting an unfinished parent cancels its 'cancel' children.
    p2 = await client.insert(Step("p2"), queue="elsewhere")
    c2 = await client.insert(Step("c2"), depends_on=[p2], queue="elsewhere")
    conn.execute("DELETE FROM awa.jobs WHERE id = %s", (p2.id,))
    row = must_job_row(conn, c2.id)
    assert row["state"] == "cancelled"
    assert row["errors"][-1]["error"] == f"cancelled: dependency {p2.id} (deleted) ended cancelled"
    assert job_row(conn, p2.id) is None


async def test_a_callback_failed_through_the_client_fires_its_dependents_cancelled_hooks(
    client: awa.AsyncClient, conn: Conn
) -> None:
    cancelled: list[int] = []
    client.on_event(
        Step,
        lambda event: cancelled.append(event.job.id) if isinstance(event, awa.Cancelled) else None,
    )
    parent = await client.insert(Step("parked"), queue="nobody")
    child = await client.insert(Step("after"), depends_on=[parent], queue="nobody")
    callback_id = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    set_state(conn, parent.id, "waiting_external", callback_id=callback_id, attempt=1)
    failed = await client.fail_external(callback_id, "the provider said no")
    assert failed.state is awa.JobState.FAILED
    assert must_job_row(conn, child.id)["state"] == "cancelled"
    await wait_for(lambda: cancelled == [child.id], message=lambda: f"{cancelled}")


async def test_wait_says_when_the_job_leaves_the_table(client: awa.AsyncClient, conn: Conn) -> None:
    job = await client.insert(Step("doomed"), queue="nobody")
    waiting = asyncio.create_task(client.wait(job.id, timeout=10))
    await wait_for(lambda: must_job_row(conn, job.id)["watched"])
    conn.execute("DELETE FROM awa.jobs WHERE id = %s", (job.id,))
    with pytest.raises(awa.ValidationError, match=f"job {job.id} left awa.jobs"):
        await waiting
