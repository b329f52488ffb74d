"""Fault tests with real worker processes and a real Postgres: kill -9 of workers mid-handler,
a Postgres restart and stop mid-drain, every worker connection terminated, poison jobs that
hang or kill their process, and the leader killed or cut off (reliability.md §4 A1, A5,
B1, B3, C1, C2).

Workers are subprocesses running tests/procs/fault_worker.py; their output goes to files.
Each handler records its start and its side effect in tables of its own, each in its own
transaction, keyed by (job id, run_lease), so the tests can tell an execution from a
completion: every job must end completed (none lost), and no job may have been carried out
by two attempts whose processes were both alive (none completed twice).

Tests wait on database state with deadlines; the only pauses are the rhythm of the kills.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import awa
from conftest_cluster import Cluster, cluster  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

WORKER = Path(__file__).resolve().parent / "procs" / "fault_worker.py"
KIND = "fault_job"
QUEUE = "fault"

LEDGER = """
DROP TABLE IF EXISTS fault_starts, fault_effects, fault_rescued;
CREATE TABLE fault_starts (
    job_id bigint, run_lease bigint, pid int, at timestamptz DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, run_lease));
CREATE TABLE fault_effects (
    job_id bigint, run_lease bigint, pid int, at timestamptz DEFAULT clock_timestamp(),
    PRIMARY KEY (job_id, run_lease));
CREATE TABLE fault_rescued (
    job_id bigint, run_lease bigint, reason text, pid int,
    at timestamptz DEFAULT clock_timestamp());
"""

Conn = psycopg.Connection[Any]


# Worker processes ---------------------------------------------------------------------------


class Worker:
    """One fault_worker.py process; its stdout and stderr go to files in ``folder``."""

    def __init__(self, url: str, name: str, folder: Path, *options: str) -> None:
        self.url = url
        self.name = name
        self.folder = folder
        self.options = options
        self.process: subprocess.Popen[bytes] | None = None
        self.generation = 0
        self.pids: list[int] = []

    @property
    def application_name(self) -> str:
        return f"awa-fault-{self.name}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    @property
    def log_path(self) -> Path:
        return self.folder / f"{self.name}.{self.generation}.log"

    def start(self, timeout: float = 30) -> Worker:
        self.generation += 1
        out = self.folder / f"{self.name}.{self.generation}.out"
        with out.open("wb") as stdout, self.log_path.open("wb") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(WORKER), "--name", self.name, *self.options],
                env={**os.environ, "DATABASE_URL": self.url},
                stdout=stdout,
                stderr=stderr,
            )
        self.pids.append(self.process.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "ready" in out.read_text():
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"worker {self.name} did not start:\n{self.tail()}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM (graceful shutdown), then SIGKILL if it does not exit in 20 s."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def log(self) -> str:
        return "".join(
            (self.folder / f"{self.name}.{n}.log").read_text(errors="replace")
            for n in range(1, self.generation + 1)
        )

    def tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.generation else ""
        return f"--- {self.name} (last {lines} lines) ---\n" + "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def worker_pool(url: str) -> Iterator[Callable[..., Worker]]:
    """A factory of workers; every worker is stopped at the end, and the last lines of each
    worker's log are printed when the test fails."""
    folder = Path(tempfile.mkdtemp(prefix="awa-faults-"))
    created: list[Worker] = []
    tag = uuid.uuid4().hex[:6]

    def make(name: str, *options: str) -> Worker:
        worker = Worker(url, f"{tag}-{name}", folder, *options)
        created.append(worker)
        return worker

    try:
        yield make
    except BaseException:
        for worker in created:
            print(worker.tail())
        print(f"worker logs kept in {folder}")
        raise
    else:
        shutil.rmtree(folder, ignore_errors=True)
    finally:
        for worker in created:
            worker.stop()


# Database helpers ---------------------------------------------------------------------------


def wait_until(
    check: Callable[[], Any], timeout: float, message: str | Callable[[], str] = ""
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"not within {timeout}s: {text}")
        time.sleep(0.05)


def scalar(conn: Conn, statement: str, *params: Any) -> Any:
    row = conn.execute(statement, params).fetchone()
    assert row is not None
    return row[0]


def states(conn: Conn, kind: str = KIND) -> dict[str, int]:
    rows = conn.execute(
        "SELECT state::text, count(*) FROM awa.jobs WHERE kind = %s GROUP BY 1", (kind,)
    ).fetchall()
    return {state: count for state, count in rows}


def completed(conn: Conn) -> int:
    return int(
        scalar(conn, "SELECT count(*) FROM awa.jobs WHERE kind = %s AND state = 'completed'", KIND)
    )


def insert_jobs(conn: Conn, count: int, *, first: int = 1, queue: str = QUEUE) -> None:
    conn.execute(
        "INSERT INTO awa.jobs (kind, queue, args) SELECT %s, %s, jsonb_build_object('n', g)"
        " FROM generate_series(%s::int, %s::int) AS g",
        (KIND, queue, first, first + count - 1),
    )


def leader_name(conn: Conn) -> str | None:
    from awa.sql import query

    row = conn.execute(query("leader_holder")).fetchone()
    return None if row is None else str(row[1])


def connect(url: str) -> Conn:
    return psycopg.connect(url, autocommit=True)


def connect_retrying(url: str, timeout: float = 30) -> Conn:
    """Connect, retrying while the server restarts."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return connect(url)
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def check_ledger(conn: Conn, total: int, killed: set[int]) -> dict[str, int]:
    """Every job completed, each by exactly one attempt whose effect is recorded under its
    final lease; returns the figures. Jobs carried out twice are allowed only when all but
    one of the attempts ran in a process that was killed."""
    assert states(conn) == {"completed": total}, states(conn)
    missing = scalar(
        conn,
        "SELECT count(*) FROM awa.jobs AS j WHERE j.kind = %s AND NOT EXISTS ("
        " SELECT 1 FROM fault_effects AS e WHERE e.job_id = j.id AND e.run_lease = j.run_lease)",
        KIND,
    )
    assert missing == 0, f"{missing} completed jobs have no side effect under their lease"
    rows = conn.execute(
        "SELECT job_id, array_agg(pid ORDER BY run_lease) FROM fault_effects GROUP BY job_id"
        " HAVING count(*) > 1"
    ).fetchall()
    double = [job for job, pids in rows if sum(pid not in killed for pid in pids) > 1]
    assert double == [], f"jobs carried out by two live attempts: {double[:20]}"
    # Each claim is an attempt, and each extra attempt was a rescue of a dead one.
    mismatched = scalar(
        conn,
        "SELECT count(*) FROM awa.jobs WHERE kind = %s AND attempt <> run_lease",
        KIND,
    )
    assert mismatched == 0
    rescues = scalar(
        conn,
        "SELECT count(*) FROM awa.jobs, jsonb_array_elements(errors) AS e"
        " WHERE kind = %s AND e ? 'rescued'",
        KIND,
    )
    extra_attempts = scalar(
        conn, "SELECT coalesce(sum(attempt - 1), 0) FROM awa.jobs WHERE kind = %s", KIND
    )
    assert rescues == extra_attempts, (rescues, extra_attempts)
    return {
        "jobs": total,
        "rescues": int(rescues),
        "re_executed": len(rows),
        "double_completed": len(double),
        "lost": total - completed(conn),
    }


def mid_handler(conn: Conn, pid: int) -> bool:
    """Whether process ``pid`` is inside a handler: it recorded the start of an attempt that
    is still running and has no side effect yet."""
    return bool(
        scalar(
            conn,
            "SELECT EXISTS (SELECT 1 FROM fault_starts AS s"
            " JOIN awa.jobs AS j ON j.id = s.job_id AND j.run_lease = s.run_lease"
            " WHERE s.pid = %s AND j.state = 'running' AND NOT EXISTS ("
            "  SELECT 1 FROM fault_effects AS e"
            "  WHERE e.job_id = s.job_id AND e.run_lease = s.run_lease))",
            pid,
        )
    )


def notes(conn: Conn) -> int:
    """Rescue follow-ups enqueued (on_rescued_enqueue_with in the worker)."""
    return int(scalar(conn, "SELECT count(*) FROM awa.jobs WHERE kind = 'fault_rescue_note'"))


def effects_by(conn: Conn, pid: int) -> int:
    return int(scalar(conn, "SELECT count(*) FROM fault_effects WHERE pid = %s", pid))


@pytest.fixture
def fault_db(database_url: str) -> Iterator[str]:
    """The test database with the handlers' ledger tables."""
    with connect(database_url) as conn:
        conn.execute(LEDGER)
    yield database_url
    with connect(database_url) as conn:
        conn.execute("DROP TABLE IF EXISTS fault_starts, fault_effects, fault_rescued")


@pytest.fixture
def cluster_db(cluster: Cluster) -> str:  # noqa: F811
    """A fresh migrated database on the throwaway cluster, with the ledger tables."""
    url = cluster.create_database()
    with connect(url) as conn:
        conn.execute(LEDGER)
    return url


# A1: kill -9 mid-handler, repeatedly ---------------------------------------------------------


def test_kill_9_mid_handler_repeatedly(fault_db: str) -> None:
    total = 1000
    kills_wanted = 8
    with connect(fault_db) as conn, worker_pool(fault_db) as worker:
        survivor = worker("survivor").start()
        # The survivor leads (it starts first and never dies), so it sees every rescue.
        wait_until(lambda: leader_name(conn) == survivor.application_name, 10, "no leader")
        victim = worker("victim").start()
        insert_jobs(conn, total)
        killed: set[int] = set()
        while len(killed) < kills_wanted and completed(conn) < total - 200:
            pid = victim.pid
            # Let the new process do some work, then catch it inside a handler.
            wait_until(lambda p=pid: effects_by(conn, p) >= 5, 30, "the victim does no work")
            wait_until(lambda p=pid: mid_handler(conn, p), 30, "the victim is never mid-handler")
            victim.kill()
            killed.add(pid)
            victim.start()
        assert survivor.alive()
        wait_until(lambda: completed(conn) == total, 90, lambda: f"states: {states(conn)}")
        figures = check_ledger(conn, total, killed)
        # The leader (the survivor) saw a Rescued event and ran the follow-up of each one.
        wait_until(
            lambda: scalar(conn, "SELECT count(*) FROM fault_rescued") == figures["rescues"],
            10,
            "Rescued hooks missing",
        )
        wait_until(lambda: notes(conn) == figures["rescues"], 10, "rescue follow-ups missing")
        hooks = scalar(conn, "SELECT count(*) FROM fault_rescued")
        reasons = conn.execute(
            "SELECT DISTINCT e ->> 'rescued' FROM awa.jobs, jsonb_array_elements(errors) AS e"
            " WHERE kind = %s",
            (KIND,),
        ).fetchall()
    assert len(killed) >= 5
    assert figures["rescues"] >= len(killed)  # every kill stranded at least one attempt
    assert reasons == [("stale_heartbeat",)]
    print(
        f"\nkill -9: {total} jobs, {len(killed)} kills, {figures['rescues']} rescues "
        f"(Rescued hooks and follow-ups: {hooks}), {figures['re_executed']} jobs re-executed "
        f"after a kill, "
        f"lost {figures['lost']}, completed twice by live attempts {figures['double_completed']}"
    )


# A5: poison jobs -----------------------------------------------------------------------------


def insert_poison(conn: Conn, queue: str, max_attempts: int = 3) -> int:
    return int(
        scalar(
            conn,
            "INSERT INTO awa.jobs (kind, queue, args, max_attempts)"
            " VALUES (%s, %s, '{\"n\": 0}', %s) RETURNING id",
            KIND,
            queue,
            max_attempts,
        )
    )


def rescue_reasons(conn: Conn, job_id: int) -> list[str]:
    rows = conn.execute(
        "SELECT e ->> 'rescued' FROM awa.jobs, jsonb_array_elements(errors) AS e"
        " WHERE id = %s ORDER BY (e ->> 'attempt')::int",
        (job_id,),
    ).fetchall()
    return [reason for (reason,) in rows]


def job_state(conn: Conn, job_id: int) -> str:
    return str(scalar(conn, "SELECT state::text FROM awa.jobs WHERE id = %s", job_id))


def test_a_handler_that_always_hangs_ends_failed(fault_db: str) -> None:
    """A handler that never returns (and never looks at is_cancelled()) is rescued at its
    deadline on every attempt, and the job fails after max_attempts."""
    with connect(fault_db) as conn, worker_pool(fault_db) as worker:
        worker("hang", "--mode", "hang", "--deadline", "0.5").start()
        job_id = insert_poison(conn, QUEUE)
        wait_until(lambda: job_state(conn, job_id) == "failed", 60, lambda: states(conn))
        assert scalar(conn, "SELECT attempt FROM awa.jobs WHERE id = %s", job_id) == 3
        assert rescue_reasons(conn, job_id) == ["deadline_exceeded"] * 3
        wait_until(
            lambda: (
                scalar(conn, "SELECT count(*) FROM fault_rescued WHERE job_id = %s", job_id) == 3
            ),
            10,
            "Rescued hooks",
        )
        last = conn.execute(
            "SELECT run_lease, reason FROM fault_rescued WHERE job_id = %s ORDER BY run_lease",
            (job_id,),
        ).fetchall()
    assert last == [(1, "deadline_exceeded"), (2, "deadline_exceeded"), (3, "deadline_exceeded")]


def test_a_handler_that_kills_its_process_ends_failed(fault_db: str) -> None:
    """A handler that kills its own process (os._exit) on every attempt: each dead attempt
    is rescued once its heartbeat is stale, and the job fails after max_attempts instead of
    killing workers forever."""
    with connect(fault_db) as conn, worker_pool(fault_db) as worker:
        leader = worker("leader").start()
        wait_until(lambda: leader_name(conn) == leader.application_name, 10, "no leader")
        crasher = worker("crasher", "--mode", "exit", "--queue", "poison").start()
        job_id = insert_poison(conn, "poison")
        deadline = time.monotonic() + 90
        while job_state(conn, job_id) != "failed":
            assert time.monotonic() < deadline, states(conn)
            if not crasher.alive():
                crasher.start()
            time.sleep(0.05)
        assert scalar(conn, "SELECT attempt FROM awa.jobs WHERE id = %s", job_id) == 3
        assert rescue_reasons(conn, job_id) == ["stale_heartbeat"] * 3
        assert leader.alive()
    # Three processes died in the handler; the fourth (if one was started) never got it.
    assert crasher.generation in (3, 4)


# C1, C2: leadership ---------------------------------------------------------------------------


def test_leader_killed_during_promotion_of_scheduled_jobs(fault_db: str) -> None:
    """SIGKILL of the leader while scheduled jobs wait for promotion: the other runtime
    takes the lock within a few seconds, promotes them, and they run."""
    with connect(fault_db) as conn, worker_pool(fault_db) as worker:
        first = worker("first").start()
        wait_until(lambda: leader_name(conn) == first.application_name, 10, "no leader")
        second = worker("second").start()
        for delay in (1.0, 2.0):
            conn.execute(
                "INSERT INTO awa.jobs (kind, queue, args, state, run_at)"
                " SELECT %s, %s, jsonb_build_object('n', g), 'scheduled',"
                " now() + make_interval(secs => %s) FROM generate_series(1, 12) AS g",
                (KIND, QUEUE, delay),
            )
        first.kill()
        killed_at = time.monotonic()
        wait_until(lambda: leader_name(conn) == second.application_name, 5, "no new leader")
        failover = time.monotonic() - killed_at
        wait_until(lambda: completed(conn) == 24, 15, lambda: f"states: {states(conn)}")
        check_ledger(conn, 24, {first.pid})
        assert scalar(conn, "SELECT count(DISTINCT pid) FROM fault_effects") == 1
    print(f"\nleader killed: the other runtime led {failover:.2f}s later")


def test_leader_connection_terminated(fault_db: str) -> None:
    """pg_terminate_backend of the backend holding the maintenance lock (found through
    pg_locks, beside a decoy advisory lock): a new holder within a few seconds, and
    promotion goes on."""
    from awa.sql import query

    with (
        connect(fault_db) as conn,
        connect(fault_db) as decoy,
        worker_pool(fault_db) as worker,
    ):
        decoy.execute("SELECT pg_advisory_lock(4242)")
        workers = [worker("one").start(), worker("two").start()]
        names = {w.application_name for w in workers}
        wait_until(lambda: leader_name(conn) in names, 10, "no leader")
        for _ in range(2):
            holder = conn.execute(query("leader_holder")).fetchone()
            assert holder is not None
            assert scalar(conn, "SELECT pg_terminate_backend(%s)", holder[0])
            terminated_at = time.monotonic()
            new = wait_until(
                lambda h=holder: (
                    (row := conn.execute(query("leader_holder")).fetchone()) is not None
                    and row[0] != h[0]
                    and row
                ),
                5,
                "no new lock holder",
            )
            print(
                f"\nleader backend terminated: a new holder ({new[1]}) after "
                f"{time.monotonic() - terminated_at:.2f}s"
            )
            assert new[1] in names
        assert scalar(decoy, "SELECT 1") == 1  # the decoy's backend was left alone
        conn.execute(
            "INSERT INTO awa.jobs (kind, queue, args, state, run_at)"
            " SELECT %s, %s, jsonb_build_object('n', g), 'scheduled',"
            " now() + interval '300 milliseconds' FROM generate_series(1, 12) AS g",
            (KIND, QUEUE),
        )
        wait_until(lambda: completed(conn) == 12, 10, lambda: f"states: {states(conn)}")
        check_ledger(conn, 12, set())
        assert all(w.alive() for w in workers)


# B1: every worker connection terminated --------------------------------------------------------


def backends(conn: Conn, names: list[str]) -> list[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = ANY(%s)", (names,)
    ).fetchall()
    return [pid for (pid,) in rows]


def test_every_worker_connection_terminated_mid_drain(fault_db: str) -> None:
    total = 600
    with connect(fault_db) as conn, worker_pool(fault_db) as worker:
        workers = [worker(name, "--staleness", "10").start() for name in ("left", "right")]
        names = [w.application_name for w in workers]
        insert_jobs(conn, total)
        for threshold in (100, 300):
            wait_until(lambda t=threshold: completed(conn) >= t, 30, "no progress")
            victims = backends(conn, names)
            assert len(victims) >= 4  # pool, listener, heartbeat and leader connections
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (victims,)
            )
            # Each worker connects again by itself.
            wait_until(lambda: all(backends(conn, [name]) for name in names), 10, "no reconnection")
        wait_until(lambda: completed(conn) == total, 60, lambda: f"states: {states(conn)}")
        figures = check_ledger(conn, total, set())
        wait_until(lambda: leader_name(conn) in names, 10, "no leader after the cut")
        assert all(w.alive() for w in workers)
        for w in workers:
            assert w.log().count(" WARNING ") < 40, w.tail(80)
    assert figures["re_executed"] == 0


# B3: Postgres restarts and stops mid-drain ------------------------------------------------------


class Reconnecting:
    """A connection for the test itself that reconnects after a server restart."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: Conn | None = None

    @property
    def conn(self) -> Conn:
        if self._conn is None or self._conn.closed:
            self._conn = connect_retrying(self.url)
        return self._conn

    def completed(self) -> int:
        try:
            return completed(self.conn)
        except psycopg.OperationalError:
            self.close()
            return completed(self.conn)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()


def timed(what: str, action: Callable[[], None]) -> None:
    started = time.monotonic()
    action()
    print(f"\n{what}: {time.monotonic() - started:.2f}s")


def warnings_since(worker: Worker, mark: int) -> list[str]:
    return [line for line in worker.log()[mark:].splitlines() if " WARNING " in line]


def test_postgres_restart_and_outage_mid_drain(cluster: Cluster, cluster_db: str) -> None:  # noqa: F811
    """Three outages during one drain: ``pg_ctl restart -m fast``, ``-m immediate`` (crash
    recovery), and a stop long enough for every worker to notice before the start. Every
    job completes once; the workers log each kind of failure once, not once per retry, and
    say when they recovered; a health check during the outage answers promptly."""
    total = 1200
    url = cluster_db
    db = Reconnecting(url)
    try:
        with worker_pool(url) as worker:
            workers = [worker(name, "--staleness", "10").start() for name in ("east", "west")]
            names = [w.application_name for w in workers]
            insert_jobs(db.conn, total)
            for mode in ("fast", "immediate"):
                target = db.completed() + 200
                wait_until(lambda t=target: db.completed() >= t, 30, "no progress")
                db.close()
                timed(f"restart -m {mode}", lambda m=mode: cluster.restart(m))

            target = db.completed() + 200
            wait_until(lambda t=target: db.completed() >= t, 30, "no progress")
            marks = [len(w.log()) for w in workers]
            db.close()
            cluster.stop("fast")
            stopped_at = time.monotonic()
            # Each worker notices (its heartbeat, listener and leader connections fail).
            wait_until(
                lambda: all(
                    "heartbeat failed" in w.log()[mark:]
                    for w, mark in zip(workers, marks, strict=True)
                ),
                15,
                "the workers never noticed the outage",
            )
            with awa.Client(url) as client:
                started = time.monotonic()
                check = client.health_check()
                assert time.monotonic() - started < 15
            assert not check.healthy
            assert not check.postgres_connected
            # Let the outage last a few heartbeat intervals, then bring the server back.
            while time.monotonic() - stopped_at < 3:
                time.sleep(0.1)
            cluster.start()
            wait_until(lambda: db.completed() == total, 60, lambda: f"states: {states(db.conn)}")
            figures = check_ledger(db.conn, total, set())
            wait_until(lambda: leader_name(db.conn) in names, 10, "no leader after the outage")
            with awa.Client(url) as client:
                assert client.health_check().healthy
            assert all(w.alive() for w in workers)
            during = [warnings_since(w, mark) for w, mark in zip(workers, marks, strict=True)]
            for w, mark, lines in zip(workers, marks, during, strict=True):
                assert len(lines) <= 15, "\n".join(lines)
                assert "recovered after" in w.log()[mark:]
    finally:
        db.close()
    assert figures["re_executed"] == 0
    print(
        f"\nPostgres restarted (fast, immediate) and stopped for 3s during a drain of {total}: "
        f"lost {figures['lost']}, completed twice {figures['double_completed']}, "
        f"warnings per worker during the stop: {[len(lines) for lines in during]}"
    )


# Shutdown while the database is down ------------------------------------------------------------


@dataclasses.dataclass
class FaultJob:
    n: int


async def test_shutdown_during_an_outage_returns_and_loses_nothing(
    cluster: Cluster,  # noqa: F811
    cluster_db: str,
) -> None:
    """Handlers finish while Postgres is stopped, so their completions cannot be saved:
    the worker's health check says so promptly, shutdown still returns within seconds (it
    gives up instead of retrying forever, and does not wait out a claim stuck on the pool),
    and the jobs, left running, are rescued and completed by another runtime afterwards."""
    url = cluster_db
    release = asyncio.Event()
    settings: dict[str, Any] = {
        "heartbeat_interval": 0.5,
        "heartbeat_staleness": 2.0,
        "heartbeat_rescue_interval": 0.5,
        "leader_election_interval": 0.5,
        "promote_interval": 0.1,
    }
    first = awa.AsyncClient(url, application_name="awa-fault-outage-1")

    @first.task(FaultJob, queue=QUEUE)
    async def wait_then_finish(job: awa.Job[FaultJob]) -> None:
        await release.wait()

    await first.start({QUEUE: {"max_workers": 4, "poll_interval": 0.1}}, **settings)
    with connect(url) as conn:
        insert_jobs(conn, 3)
        await asyncio.to_thread(
            wait_until, lambda: states(conn) == {"running": 3}, 10, lambda: states(conn)
        )
    try:
        await asyncio.to_thread(cluster.stop, "fast")
        # The worker's health check answers promptly, without waiting out the pool.
        asked = time.monotonic()
        check = await first.health_check()
        answered = time.monotonic() - asked
        assert answered < 8, f"health_check took {answered:.1f}s"
        assert not check.postgres_connected
        assert check.runtime is not None
        assert check.runtime.in_flight == 3
        release.set()
        started = time.monotonic()
        await first.shutdown(timeout=2)
        await first.close()
        took = time.monotonic() - started
    finally:
        await asyncio.to_thread(cluster.start)
    assert took < 15, f"shutdown took {took:.1f}s"

    with connect(url) as conn:
        assert states(conn) == {"running": 3}  # the completions were given up, not lost
        second = awa.AsyncClient(url, application_name="awa-fault-outage-2")
        second.task(FaultJob, queue=QUEUE)(wait_then_finish)
        await second.start({QUEUE: {"max_workers": 4, "poll_interval": 0.1}}, **settings)
        try:
            await asyncio.to_thread(
                wait_until, lambda: states(conn) == {"completed": 3}, 30, lambda: states(conn)
            )
        finally:
            await second.close()
        attempts = conn.execute("SELECT attempt FROM awa.jobs ORDER BY id").fetchall()
    assert attempts == [(2,), (2,), (2,)]
    print(f"\nshutdown while Postgres was down returned in {took:.1f}s")
