"""Storage under a pinned MVCC horizon (migration 12, docs/architecture.md).

While a transaction holds an old snapshot, vacuum can remove no row version written since.
The claim must not walk the dead entries earlier claims left behind: it reads each lane of
its queue from where the last claim stopped. The leader's rotation truncates the active
ring's slots, which frees dead rows whatever snapshot is held. Completed jobs are counted
without reading every completed row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import awa
from awa.observability.endpoint import observability_app
from awa.sql import query
from awa.ui import create_app
from awa.worker.lanes import LanePositions, claim_statement
from helpers_ui import browse
from helpers_worker import wait_for
from jobs_helpers import Conn

DEADLINE = dt.timedelta(minutes=5)


@dataclasses.dataclass
class Tick:
    n: int


@pytest.fixture
def pinned(database_url: str) -> Iterator[Conn]:
    """A REPEATABLE READ transaction holding its snapshot (and an xid) open: the MVCC
    horizon stays where it is while the test runs."""
    with psycopg.connect(database_url) as pin:
        pin.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT txid_current(), count(*) FROM pg_class")
        yield pin
        pin.rollback()


def available_entries_read(conn: Conn) -> int:
    """Entries of the claim's index read so far in this transaction (dead ones included)."""
    row = conn.execute(
        "SELECT COALESCE(sum(pg_stat_get_xact_tuples_returned(h.inhrelid)), 0)"
        " FROM pg_inherits AS h WHERE h.inhparent = 'awa.active_jobs_available_idx'::regclass"
    ).fetchone()
    assert row is not None
    return int(row[0])


def claim(conn: Conn, lanes: LanePositions, limit: int) -> tuple[list[Any], int]:
    """One claim as a dispatcher makes it; returns its rows and the index entries it read."""
    priorities = lanes.start_claim()
    if not priorities:  # every lane found empty, none announced since: no query
        lanes.claimed([], emptied=False)
        return [], 0
    with conn.transaction():
        before = available_entries_read(conn)
        params = {"queue": "default", "limit": limit, "deadline": DEADLINE, "kinds": ["tick"]}
        rows = conn.execute(
            claim_statement(priorities, limit), {**params, **lanes.params(priorities)}
        ).fetchall()
        read = available_entries_read(conn) - before
    lanes.claimed(rows, emptied=len(rows) < limit)
    return rows, read


def complete(conn: Conn, rows: list[Any]) -> None:
    params = {"ids": [r[0] for r in rows], "leases": [r[7] for r in rows], "outputs": None}
    conn.execute(query("complete_batch"), params)


async def test_the_claim_reads_no_more_under_a_pin_however_many_jobs_pass(
    client: awa.AsyncClient, database_url: str, pinned: Conn
) -> None:
    """5,000 jobs pass under a pinned snapshot: the claim from its lane positions reads as
    many index entries at the end as at the start, while a claim from the head of the lane
    (what every claim did before) reads every dead entry the others left."""
    lanes = LanePositions(full_sweep_interval=3600)
    reads: list[int] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        for round_ in range(50):
            await client.insert_many([Tick(n) for n in range(100)])
            rows, read = claim(conn, lanes, 100)
            assert len(rows) == 100, f"round {round_}: {len(rows)} claimed"
            reads.append(read)
            complete(conn, rows)
        await client.insert_many([Tick(n) for n in range(100)])
        _, from_head = claim(conn, LanePositions(), 100)
    first, last = max(reads[1:6]), max(reads[-5:])
    assert last <= first * 1.5 + 10, f"claims read {reads}"
    # Sanity: the dead entries are there, under the pin.
    assert from_head > 20 * last, f"a claim from the head read {from_head}, others {last}"


async def test_a_job_committed_behind_a_lane_position_is_announced_and_claimed(
    client: awa.AsyncClient, database_url: str
) -> None:
    """A transaction that inserted a job and committed after later jobs were claimed: its
    job sits before the lane position; its notification moves the lane back to it."""
    lanes = LanePositions(full_sweep_interval=3600)
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        psycopg.connect(database_url, autocommit=True) as listener,
    ):
        listener.execute("LISTEN awa_ready")
        late = await client.transaction()
        slow = await late.insert(Tick(0))
        await client.insert(Tick(1))  # committed first, claimed first
        rows, _ = claim(conn, lanes, 10)
        assert [r[0] for r in rows] == [slow.id + 1]
        await late.commit()
        rows, _ = claim(conn, lanes, 10)
        assert rows == []  # the lane moved past it
        for notify in listener.notifies(timeout=5, stop_after=2):
            ready = notify.payload.split(" ", 3)
            lanes.rewind(int(ready[0]), int(ready[1]), int(ready[2]))
        rows, _ = claim(conn, lanes, 10)
        assert [r[0] for r in rows] == [slow.id]


LOCKERS = {
    "wait": "SELECT count(*) FROM awa.watch_jobs(ARRAY[%s]::bigint[])",
    "a workflow naming it as a parent": "SELECT awa.flag_jobs(ARRAY[%s]::bigint[], true, false)",
    "an update through awa.jobs": "UPDATE awa.jobs SET tags = ARRAY['seen'] WHERE id = %s",
}


@pytest.mark.parametrize("locker", LOCKERS)
async def test_a_job_locked_without_a_move_while_a_claim_passes_is_announced_again(
    client: awa.AsyncClient, database_url: str, locker: str
) -> None:
    """A statement that locks an available job and leaves it in its lane: a claim meanwhile
    skips it (SKIP LOCKED) and finds the lane empty; the statement's notification brings the
    lane back to the job once it commits."""
    lanes = LanePositions(full_sweep_interval=3600)
    job = await client.insert(Tick(0))
    with (
        psycopg.connect(database_url, autocommit=True) as conn,
        psycopg.connect(database_url, autocommit=True) as listener,
        psycopg.connect(database_url) as holder,
    ):
        listener.execute("LISTEN awa_ready")
        holder.execute(LOCKERS[locker], (job.id,))  # type: ignore[arg-type]
        assert claim(conn, lanes, 10)[0] == []  # skipped: locked
        holder.commit()
        assert claim(conn, lanes, 10)[0] == []  # the lane was found empty: not read
        for notify in listener.notifies(timeout=5, stop_after=1):
            ready = notify.payload.split(" ", 3)
            assert ready[3] == "default"
            lanes.rewind(int(ready[0]), int(ready[1]), int(ready[2]))
        assert [r[0] for r in claim(conn, lanes, 10)[0]] == [job.id]


async def test_a_job_flagged_while_it_moves_between_homes_keeps_the_flag(
    client: awa.AsyncClient, conn: Conn, database_url: str
) -> None:
    """A scheduled parent is promoted (held -> active) while a workflow insert flags it: the
    flag follows it into its new home, so its completion still releases the children."""
    parent = await client.insert(Tick(0), run_at=dt.datetime.now(dt.UTC) + DEADLINE)
    with psycopg.connect(database_url) as promoter:
        promoter.execute(
            "UPDATE awa.jobs SET state = 'available', run_at = now() WHERE id = %s", (parent.id,)
        )
        with psycopg.connect(database_url, autocommit=True) as flagger:
            thread = threading.Thread(
                target=flagger.execute,
                args=("SELECT awa.flag_jobs(ARRAY[%s]::bigint[], true, false)", (parent.id,)),
            )
            thread.start()
            await wait_for(
                lambda: waiting_on_a_lock(conn, "SELECT awa.flag_jobs%"),
                message="the flag never waited for the promotion",
            )
            promoter.commit()
            thread.join(10)
    row = conn.execute(
        "SELECT state, has_dependents FROM awa.jobs WHERE id = %s", (parent.id,)
    ).fetchone()
    assert row == ("available", True)


def active_size(conn: Conn) -> int:
    row = conn.execute(
        "SELECT sum(pg_relation_size(h.inhrelid)) FROM pg_inherits AS h"
        " WHERE h.inhparent = 'awa.active_jobs'::regclass"
    ).fetchone()
    assert row is not None
    return int(row[0])


def rotate(conn: Conn) -> str | None:
    row = conn.execute(
        query("rotate_active_ring"), {"min_age": 0, "max_move": 10_000, "lock_timeout": "1s"}
    ).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


async def test_rotation_frees_dead_rows_under_a_pin(
    client: awa.AsyncClient, database_url: str, pinned: Conn
) -> None:
    """Under a pin, 3,000 jobs leave their dead versions in the active ring; once round the
    ring, every slot has been truncated and holds only the live jobs, moved along."""
    lanes = LanePositions(full_sweep_interval=3600)
    with psycopg.connect(database_url, autocommit=True) as conn:
        for _ in range(30):
            await client.insert_many([Tick(n) for n in range(100)])
            rows, _ = claim(conn, lanes, 100)
            complete(conn, rows)
        live = await client.insert_many([Tick(n) for n in range(10)])
        grown = active_size(conn)
        for _ in range(4):
            assert rotate(conn) is not None
        shrunk = active_size(conn)
        rows, _ = claim(conn, LanePositions(), 100)
    assert grown > 500_000, grown
    assert shrunk < grown / 20, (grown, shrunk)
    assert sorted(r[0] for r in rows) == [job.id for job in live]


async def test_rotation_leaves_a_backlog_in_place_and_frees_the_other_slots(
    client: awa.AsyncClient, database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        await client.insert_many([Tick(n) for n in range(50)])
        [(backlog_slot,)] = conn.execute("SELECT DISTINCT slot FROM awa.active_jobs").fetchall()
        moves = {"min_age": 0, "max_move": 10, "lock_timeout": "1s"}
        for _ in range(6):
            conn.execute(query("rotate_active_ring"), moves)
        slots = conn.execute("SELECT DISTINCT slot FROM awa.active_jobs").fetchall()
        current = conn.execute("SELECT awa.active_slot()").fetchone()
    assert slots == [(backlog_slot,)]  # 50 jobs: more than max_move, left where they are
    assert current is not None
    assert current[0] != backlog_slot


def completed(conn: Conn) -> dict[str, tuple[int, int]]:
    rows = conn.execute(
        "SELECT queue, total, since FROM awa.completed_counts(now() - interval '1 hour')"
    ).fetchall()
    return {queue: (total, since) for queue, total, since in rows}


def exact(conn: Conn) -> dict[str, tuple[int, int]]:
    rows = conn.execute(
        "SELECT queue, count(*),"
        " count(*) FILTER (WHERE finalized_at >= now() - interval '1 hour')"
        " FROM awa.done_jobs GROUP BY queue"
    ).fetchall()
    return {queue: (total, since) for queue, total, since in rows}


def done(conn: Conn, queue: str, ages: list[float]) -> None:
    conn.execute(
        "INSERT INTO awa.done_jobs (kind, queue, state, attempt, finalized_at)"
        " SELECT 'tick', %s, 'completed', 1, now() - make_interval(secs => a)"
        " FROM unnest(%s::float8[]) AS a",
        (queue, ages),
    )


def test_completed_counts_are_exact(conn: Conn) -> None:
    """Jobs completed in the last hour and before, the minute an hour ago, rows deleted one
    by one, count rows folded: the counts always equal a count of the rows."""
    done(conn, "a", [30, 90, 3000, 3599, 3601, 3660, 7200, 86_000])
    done(conn, "b", [10, 3700])
    assert completed(conn) == exact(conn)
    conn.execute("SELECT awa.fold_done_counts()")
    assert completed(conn) == exact(conn)
    done(conn, "a", [1, 2, 3])
    conn.execute(
        "DELETE FROM awa.done_jobs WHERE queue = 'b' AND finalized_at < now() - '1h'::interval"
    )
    conn.execute("DELETE FROM awa.jobs WHERE id = (SELECT max(id) FROM awa.done_jobs)")
    assert completed(conn) == exact(conn)
    conn.execute("SELECT awa.fold_done_counts()")
    assert completed(conn) == exact(conn)
    assert completed(conn)["a"][0] == 10


def waiting_on_a_lock(conn: Conn, statement_like: str) -> bool:
    row = conn.execute(
        "SELECT count(*) > 0 FROM pg_stat_activity"
        " WHERE wait_event_type = 'Lock' AND query LIKE %s",
        (statement_like,),
    ).fetchone()
    return bool(row and row[0])


def test_an_update_through_the_view_keeps_what_another_transaction_changed_meanwhile(
    conn: Conn, database_url: str
) -> None:
    """An operator's update of a running job through awa.jobs waits for a heartbeat's
    transaction on the row, then changes only its own columns: the heartbeat's progress
    stays, as with a plain table's UPDATE."""
    conn.execute(
        "INSERT INTO awa.active_jobs (kind, queue, args, state, attempt, run_lease)"
        " VALUES ('tick', 'q', '{}', 'running', 1, 1)"
    )
    row = conn.execute("SELECT id FROM awa.active_jobs").fetchone()
    assert row is not None
    job_id = row[0]
    with psycopg.connect(database_url) as heartbeat:
        heartbeat.execute(
            "UPDATE awa.active_jobs SET progress = '{\"done\": 7}', heartbeat_at = now()"
            " WHERE id = %s",
            (job_id,),
        )
        with psycopg.connect(database_url, autocommit=True) as operator:
            operator.execute("SET lock_timeout = '5s'")
            updated: list[int] = []
            thread = threading.Thread(
                target=lambda: updated.append(
                    operator.execute(
                        "UPDATE awa.jobs SET tags = ARRAY['looked-at'] WHERE id = %s", (job_id,)
                    ).rowcount
                )
            )
            thread.start()
            deadline = time.monotonic() + 5
            while not waiting_on_a_lock(conn, "UPDATE awa.jobs SET tags%"):
                assert time.monotonic() < deadline, "the operator's update never waited"
                time.sleep(0.01)
            heartbeat.commit()
            thread.join(10)
    assert updated == [1]
    after = conn.execute(
        "SELECT progress, tags, heartbeat_at IS NOT NULL FROM awa.jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert after == ({"done": 7}, ["looked-at"], True)


# Blocks (8 KiB) one read may touch beside the million finished jobs: those jobs fill ~20,000,
# so a read that scanned them, or counted them row by row, would pass it many times over.
READ_BLOCKS = 2_000


LEADING_COMMENTS = re.compile(r"^(\s*--[^\n]*\n)*\s*")


@contextlib.contextmanager
def captured_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[Any, Any]]]:
    """Every SELECT the client's connections send meanwhile (statement, parameters)."""
    seen: list[tuple[Any, Any]] = []
    execute = psycopg.AsyncCursor.execute

    async def recording(self: Any, statement: Any, params: Any = None, **kwargs: Any) -> Any:
        text = statement if isinstance(statement, str) else statement.as_string(self.connection)
        if LEADING_COMMENTS.sub("", text).upper().startswith(("SELECT", "WITH")):
            seen.append((text, params))
        return await execute(self, statement, params, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(psycopg.AsyncCursor, "execute", recording)
        yield seen


def blocks_read(conn: Conn, statement: str, params: Any) -> int:
    """The shared blocks ``statement`` touches when run (EXPLAIN ANALYZE BUFFERS)."""
    explained = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params)
    row = explained.fetchone()
    assert row is not None
    plan = row[0][0]["Plan"]
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


@pytest.mark.slow
async def test_admin_reads_stay_small_under_a_pin_beside_a_million_finished_jobs(
    client: awa.AsyncClient, database_url: str, pinned: Conn, monkeypatch: pytest.MonkeyPatch
) -> None:
    """queue_stats(), the UI's overview and jobs pages and a metrics scrape, beside
    1,000,000 completed jobs while a snapshot is pinned: every statement they send touches
    at most READ_BLOCKS blocks (it reads counters and index ranges, never the million rows).
    Block counts, not timings: they do not move with the machine's load."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO awa.done_jobs (kind, queue, args, state, attempt, finalized_at)"
            " SELECT 'tick', 'reports', '{}', 'completed', 1,"
            # Half in the last 20 minutes, half two to three hours ago: far from the hour.
            " now() - make_interval(secs => CASE WHEN g <= 500000 THEN g / 500.0"
            "                                    ELSE 7200 + g / 500.0 END)"
            " FROM generate_series(1, 1000000) AS g"
        )
        conn.execute("ANALYZE awa.done_jobs")
    await client.insert_many([Tick(n) for n in range(100)], queue="reports")
    with captured_reads(monkeypatch) as reads:
        stats = {entry.queue: entry for entry in await client.queue_stats()}
        app = create_app(client, title="pinned")
        async with browse(app) as http:
            for path in ("/", "/jobs", "/jobs?state=completed"):
                response = await http.get(path)
                assert response.status_code == 200, response.text[:500]
        async with browse(observability_app(client)) as http:
            assert (await http.get("/metrics")).status_code == 200
    assert stats["reports"].count("completed") == 1_000_000
    assert stats["reports"].completed_last_hour == 500_000
    assert len(reads) >= 4
    with psycopg.connect(database_url) as conn:
        touched = {statement: blocks_read(conn, statement, params) for statement, params in reads}
        # The measure can fail: counting the queue's rows touches far more.
        counting = "SELECT count(*) FROM awa.jobs WHERE queue = 'reports'"
        assert blocks_read(conn, counting, None) > 5 * READ_BLOCKS
        conn.rollback()
    print("\nblocks per read beside 1,000,000 completed jobs:", sorted(touched.values()))
    heavy = {
        statement[:120]: blocks for statement, blocks in touched.items() if blocks > READ_BLOCKS
    }
    assert not heavy, heavy
