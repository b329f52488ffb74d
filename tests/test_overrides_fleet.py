"""Live queue overrides across a fleet: two worker processes (tests/procs/flow_worker.py)
run one queue; a cap set while they run holds within seconds, a pause stops both, and a
clear gives them back their configured settings. An override written without its
notification (a missed one) is applied by the workers' periodic read."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import awa
from helpers_flow import RunningSampler
from jobs_helpers import Conn
from test_flow_fleet import count, fleet, insert_calls, wait_until

pytestmark = pytest.mark.slow

# Applied within this many seconds of the change (the notification makes it sooner; the
# periodic read, every 5 s by default, bounds it when a notification is missed).
APPLIED_WITHIN = 10.0

QUEUES = {"api": {"max_workers": 4, "poll_interval": 0.05}, "probe": {"max_workers": 2}}


def running(conn: Conn) -> int:
    return count(conn, "state = 'running' AND queue = 'api'")


def settles(conn: Conn, low: int, high: int, message: str) -> float:
    """Seconds until the running count is within [low, high]."""
    began = time.monotonic()
    wait_until(lambda: low <= running(conn) <= high, APPLIED_WITHIN, message)
    return time.monotonic() - began


def completed(conn: Conn, queue: str) -> int:
    return count(conn, "state = 'completed' AND queue = %s", queue)


def until_completed(conn: Conn, queue: str, more: int, message: str) -> None:
    """Until ``more`` further jobs of ``queue`` have completed: the fleet has kept working
    for that long (a window measured in work done, not in seconds slept)."""
    target = completed(conn, queue) + more
    wait_until(lambda: completed(conn, queue) >= target, APPLIED_WITHIN, message)


def test_two_worker_processes_follow_overrides_and_return_after_a_clear(
    database_url: str, conn: Conn, sync_client: awa.Client, tmp_path: Path
) -> None:
    insert_calls(conn, 5000, seconds=0.2)
    with fleet(database_url, tmp_path) as workers:
        for name in ("a", "b"):
            workers.start(name, QUEUES)
        # Configured: 4 slots each, no cap; both processes busy.
        settles(conn, 7, 8, "the fleet did not fill its 8 slots")
        sync_client.set_queue_overrides("api", global_max_running=2, changed_by="ops")
        took = settles(conn, 0, 2, "the cap was not applied")
        print(f"cap applied after {took:.2f}s")
        with RunningSampler(database_url, "api").running() as sampler:
            until_completed(conn, "api", 8, "the capped fleet stopped completing jobs")
        assert sampler.most_running <= 2, sampler.most_running
        assert sampler.most_running == 2  # still claiming, within the cap
        # A pause: neither process starts anything more.
        sync_client.set_queue_overrides("api", paused=True, changed_by="ops")
        settles(conn, 0, 0, "the pause did not stop the fleet")
        paused_at = conn.execute("SELECT now()").fetchone()
        # Both processes keep claiming other work (dozens of polls of the paused queue pass
        # meanwhile), and none of it is the paused queue's.
        insert_calls(conn, 8, seconds=0.1, queue="probe")
        until_completed(conn, "probe", 8, "the fleet stopped working its other queue")
        assert count(conn, "queue = 'api' AND attempted_at > %s", paused_at[0]) == 0
        # Cleared: the configured settings again (no cap, not paused).
        sync_client.clear_queue_overrides("api", changed_by="ops")
        took = settles(conn, 7, 8, "the clear did not give back the configured settings")
        print(f"clear applied after {took:.2f}s")
        # Without a notification, the periodic read applies it.
        conn.execute(
            "INSERT INTO awa.queue_overrides (queue, settings)"
            " VALUES ('api', '{\"global_max_running\": 1}')"
        )
        took = settles(conn, 0, 1, "the periodic read did not apply the override")
        print(f"unannounced override applied after {took:.2f}s")
        with RunningSampler(database_url, "api").running() as sampler:
            until_completed(conn, "api", 4, "the fleet stopped completing jobs under a cap of 1")
        assert sampler.most_running == 1
    changes = sync_client.queue_override_log("api")
    assert [change.action for change in changes] == ["clear", "set", "set"]
