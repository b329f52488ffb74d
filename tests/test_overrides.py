"""Live queue overrides: setting, clearing and reading them through both clients and
awa.admin, their checks, the change log, the command line, the UI (read-only included), and
a worker in this process applying them (its gauge and counter). The fleet of worker
processes is in tests/test_overrides_fleet.py."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from typing import Any

import psycopg
import pytest

import awa
from awa.ui import create_app
from awa.worker.config import QueueConfig
from awa.worker.dispatcher import QueueDispatcher
from helpers_lifecycle import counter_value, metric_reader
from helpers_ui import browse, csrf, flash, post, text
from jobs_helpers import Conn, listening, notifications_so_far, payloads
from test_cli import awa_cli, ok


@dataclasses.dataclass
class Tick:
    n: int


def test_set_merges_clear_returns_and_every_change_is_logged(
    sync_client: awa.Client, conn: Conn
) -> None:
    first = sync_client.set_queue_overrides(
        "api", rate_limit=(20, 5), poll_interval=2, changed_by="alice"
    )
    assert first.settings == {"rate_limit": [20.0, 5], "poll_interval": 2.0}
    assert first.updated_by == "alice"
    assert first.updated_at is not None
    assert not first.paused
    second = sync_client.set_queue_overrides(
        "api", {"global_max_running": 3, "paused": True}, changed_by="bob"
    )
    assert second.settings == {
        "rate_limit": [20.0, 5],
        "poll_interval": 2.0,
        "global_max_running": 3,
    }
    assert second.paused
    row = conn.execute("SELECT paused, paused_by FROM awa.queues WHERE queue = 'api'").fetchone()
    assert row == (True, "bob")
    # The same values again change nothing and log nothing.
    sync_client.set_queue_overrides("api", poll_interval=2.0, changed_by="carol")
    assert len(sync_client.queue_override_log("api")) == 2
    partly = sync_client.clear_queue_overrides("api", ["rate_limit"], changed_by="dave")
    assert partly.settings == {"poll_interval": 2.0, "global_max_running": 3}
    assert partly.paused
    [listed] = sync_client.list_queue_overrides()
    assert listed == partly
    cleared = sync_client.clear_queue_overrides("api", changed_by="erin")
    assert (cleared.settings, cleared.paused, cleared.updated_at) == ({}, False, None)
    assert sync_client.list_queue_overrides() == []
    log = sync_client.queue_override_log("api")
    assert [(c.changed_by, c.action) for c in log] == [
        ("erin", "clear"),
        ("dave", "clear"),
        ("bob", "set"),
        ("alice", "set"),
    ]
    assert log[3].old == {"paused": False}
    assert log[3].new == {"paused": False, "rate_limit": [20.0, 5], "poll_interval": 2.0}
    assert log[2].new["paused"] is True
    assert log[2].old["paused"] is False
    assert log[0].new == {"paused": False}
    assert all(c.changed_at is not None for c in log)
    assert sync_client.queue_override_log("other") == []
    assert len(sync_client.queue_override_log(limit=1)) == 1


async def test_the_same_operations_on_both_clients_and_any_connection(
    client: awa.AsyncClient, database_url: str
) -> None:
    await client.set_queue_overrides("a", claim_batch_size=7)
    with psycopg.connect(database_url) as blocking:
        awa.admin.set_queue_overrides(blocking, "b", key_concurrency=2, changed_by="ops")
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        rows = await awa.admin.list_queue_overrides(conn)
        assert [(row.queue, row.settings) for row in rows] == [
            ("a", {"claim_batch_size": 7}),
            ("b", {"key_concurrency": 2}),
        ]
        # Inside the caller's transaction: a rollback undoes the change and its log.
        async with conn.transaction(force_rollback=True):
            await awa.admin.clear_queue_overrides(conn, "a")
        assert len(await awa.admin.list_queue_overrides(conn, "a")) == 1
    changes = await client.queue_override_log()
    assert [(c.queue, c.changed_by) for c in changes] == [("b", "ops"), ("a", None)]


def test_a_change_is_announced_to_workers(
    sync_client: awa.Client, database_url: str, conn: Conn
) -> None:
    with listening(database_url, "awa_overrides") as listener:
        sync_client.set_queue_overrides("q'\"<x>", poll_interval=1)
        sync_client.set_queue_overrides("q'\"<x>", poll_interval=1)  # no change: no notice
        sync_client.clear_queue_overrides("q'\"<x>")
        got = payloads(notifications_so_far(listener, conn, "awa_overrides"), "awa_overrides")
    assert got == ["q'\"<x>", "q'\"<x>"]  # the set and the clear


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"rate_limit": -1}, r"rate_limit: the rate .* got -1"),
        ({"rate_limit": (5, -2)}, r"rate_limit: the burst .* got -2"),
        ({"rate_limit": "fast"}, r"rate_limit must be .* got 'fast'"),
        ({"global_max_running": 0}, r"global_max_running must be between 1 and \d+, got 0"),
        ({"key_concurrency": 2**31}, r"key_concurrency must be between 1 and \d+, got 2147483648"),
        ({"claim_batch_size": 1.5}, r"claim_batch_size must be an integer, not float"),
        ({"claim_batch_size": True}, r"claim_batch_size must be an integer, not bool"),
        ({"poll_interval": 0}, r"poll_interval must be > 0, got 0"),
        ({"poll_interval": float("inf")}, r"poll_interval must be a finite number .* got inf"),
        ({"deadline_duration": -5}, r"deadline_duration must be >= 0, got -5"),
        ({"deadline_duration": 10**12}, r"deadline_duration is 1e\+12 seconds; the limit"),
        ({"paused": "yes"}, r"paused must be True or False, not str"),
        ({"max_workers": 3}, r"unknown queue setting 'max_workers'; the settings are rate_limit"),
        ({}, r"give at least one setting"),
    ],
)
def test_bad_values_name_the_setting_and_value_and_write_nothing(
    sync_client: awa.Client, settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(awa.ValidationError, match=message) as caught:
        sync_client.set_queue_overrides("api", settings)
    assert isinstance(caught.value, ValueError)
    assert sync_client.list_queue_overrides() == []
    assert sync_client.queue_override_log() == []


@pytest.mark.parametrize(
    ("queue", "by", "message"),
    [
        ("", None, "queue must not be empty"),
        ("q" * 201, None, "queue is 201 characters long; the limit is 200"),
        ("a\x00b", None, "queue contains a NUL byte"),
        ("\ud800", None, "queue contains a lone surrogate"),
        ("api", "w" * 201, "changed_by is 201 characters long; the limit is 200"),
        ("api", "a\x00", "changed_by contains a NUL byte"),
        ("api", 7, "changed_by must be a string, not int"),
    ],
)
def test_hostile_names_are_refused(
    sync_client: awa.Client, queue: str, by: Any, message: str
) -> None:
    with pytest.raises(awa.ValidationError, match=re.escape(message)):
        sync_client.set_queue_overrides(queue, poll_interval=1, changed_by=by)
    with pytest.raises(awa.ValidationError, match=re.escape(message)):
        sync_client.clear_queue_overrides(queue, changed_by=by)


def test_clear_refuses_unknown_settings(sync_client: awa.Client) -> None:
    with pytest.raises(awa.ValidationError, match=r"unknown queue setting\(s\) \['bogus'\]"):
        sync_client.clear_queue_overrides("api", ["poll_interval", "bogus"])
    with pytest.raises(awa.ValidationError, match="a list of setting names"):
        sync_client.clear_queue_overrides("api", "poll_interval")


def test_the_command_line(sync_client: awa.Client, database_url: str) -> None:
    assert "override their settings live" in ok("--help").stdout
    assert "overrides" in ok("queue", "--help").stdout
    assert "set" in ok("queue", "overrides", "--help").stdout
    set_ = ok(
        "queue",
        "overrides",
        "set",
        "api",
        "--rate-limit",
        "20/5",
        "--global-max-running",
        "3",
        "--paused",
        "--by",
        "ops <b>",
        url=database_url,
    )
    assert (
        set_.stdout
        == "queue api: overrides rate_limit=20/s burst 5, global_max_running=3, paused\n"
    )
    shown = ok("queue", "overrides", "show", url=database_url).stdout
    assert "rate_limit=20/s burst 5" in shown
    assert "ops <b>" in shown
    assert "yes" in shown
    bad = awa_cli("queue", "overrides", "set", "api", "--poll-interval", "0", url=database_url)
    assert bad.exit_code == 2
    assert "poll_interval must be > 0, got 0" in bad.stderr
    bad = awa_cli("queue", "overrides", "set", "api", "--rate-limit", "x", url=database_url)
    assert bad.exit_code == 2
    assert "'--rate-limit'" in bad.stderr
    assert awa_cli("queue", "overrides", "set", "api", url=database_url).exit_code == 2
    cleared = ok("queue", "overrides", "clear", "api", "paused", "--json", url=database_url)
    assert '"paused": false' in cleared.stdout
    log = ok("queue", "overrides", "log", "--json", url=database_url).stdout
    assert '"action": "clear"' in log
    assert '"changed_by": "ops <b>"' in log
    assert "paused=True" in ok("queue", "overrides", "log", url=database_url).stdout
    ok("queue", "overrides", "clear", "api", url=database_url)
    assert ok("queue", "overrides", "show", url=database_url).stdout == "no queue overrides\n"
    assert not sync_client.list_queue_overrides()


async def test_the_ui_sets_clears_and_escapes(client: awa.AsyncClient) -> None:
    hostile = "<script>alert(1)</script>&\"'"
    async with browse(create_app(client)) as http:
        token = await csrf(http, "/overrides")
        done = await post(
            http,
            "/overrides/set",
            token,
            action="set",
            queue=hostile,
            rate="2.5",
            burst="",
            claim_batch_size="8",
            paused="true",
            by=hostile,
        )
        assert done.status_code == 303
        page = await http.get(done.headers["location"])
        assert "overridden" in (flash(page) or "")
        assert "<script>alert(1)" not in page.text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text
        assert "rate_limit=[2.5, 3]" in text(page)
        assert "claim_batch_size=8" in text(page)
        bad = await post(http, "/overrides/set", token, action="set", queue="q", poll_interval="0")
        page = await http.get(bad.headers["location"])
        assert flash(page) == "Not done: poll_interval must be > 0, got 0"
        bad = await post(http, "/overrides/set", token, action="set", queue="q", burst="x")
        page = await http.get(bad.headers["location"])
        assert flash(page) == "Not done: burst must be an integer, got 'x'"
        wrong = await post(http, "/overrides/clear", token, action="set", queue="q")
        assert wrong.status_code == 400
        refused = await http.post("/overrides/set", data={"action": "set", "queue": "q"})
        assert refused.status_code == 403
        cleared = await post(http, "/overrides/clear", token, action="clear", queue=hostile)
        assert cleared.status_code == 303
    [override] = await client.list_queue_overrides() or [None]
    assert override is None
    changes = await client.queue_override_log()
    assert [(c.queue, c.changed_by, c.action) for c in changes] == [
        (hostile, "awa ui", "clear"),
        (hostile, hostile, "set"),
    ]


async def test_read_only_ui_shows_but_hides_the_forms_and_refuses_posts(
    client: awa.AsyncClient,
) -> None:
    await client.set_queue_overrides("api", poll_interval=3, changed_by="ops")
    async with browse(create_app(client, read_only=True)) as http:
        page = await http.get("/overrides")
        assert page.status_code == 200
        assert "poll_interval=3.0" in text(page)
        assert "ops" in text(page)
        assert "<form" not in page.text.split("<main>", 1)[1]
        for path in ("/overrides/set", "/overrides/clear"):
            refused = await http.post(path, data={"csrf_token": "x", "queue": "api"})
            assert refused.status_code == 403
    assert len(await client.list_queue_overrides()) == 1


def _gauge(queue: str, setting: str) -> tuple[float, bool] | None:
    data = metric_reader().get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != "awa.queue.setting":
                    continue
                for point in metric.data.data_points:
                    found = dict(point.attributes or {})
                    if found.get("awa.job.queue") == queue and found["awa.setting"] == setting:
                        return float(point.value), bool(found["awa.setting.overridden"])
    return None


async def _stored_limits(client: awa.AsyncClient) -> tuple[Any, ...] | None:
    async with client.connection() as conn:
        cursor = await conn.execute(
            "SELECT rate, burst FROM awa.queue_limits WHERE queue = 'ticks'"
        )
        return await cursor.fetchone()


async def _until(predicate: Any, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, message
        await asyncio.sleep(0.02)


async def test_a_worker_applies_overrides_at_start_on_notice_and_after_clear(
    client: awa.AsyncClient,
) -> None:
    metric_reader()
    applied = counter_value("awa.queue.overrides_applied", **{"awa.job.queue": "ticks"})
    await client.set_queue_overrides("ticks", claim_batch_size=3, deadline_duration=0)
    started: list[float] = []

    @client.task(Tick, queue="ticks")
    async def tick(job: awa.Job[Tick]) -> None:
        started.append(time.monotonic())

    await client.start({"ticks": {"max_workers": 4, "deadline_duration": 60}})
    runtime = client._runtime
    assert runtime is not None
    dispatcher = runtime._dispatchers["ticks"]
    # Stored before the start: applied before the first claim.
    assert dispatcher.config.claim_batch_size == 3
    assert dispatcher.config.deadline_duration == 0
    assert _gauge("ticks", "claim_batch_size") == (3.0, True)
    assert _gauge("ticks", "poll_interval") == (0.5, False)
    # A change arrives by notification, well within the refresh interval (5 s).
    changed = time.monotonic()
    await client.set_queue_overrides("ticks", rate_limit=(4, 1), poll_interval=0.2)
    await _until(lambda: dispatcher.config.rate_limit == (4.0, 1), 3, "not applied")
    assert time.monotonic() - changed < 3
    assert dispatcher.config.poll_interval == 0.2
    assert _gauge("ticks", "rate") == (4.0, True)
    assert await _stored_limits(client) == (4.0, 1)  # what awa queue stats shows
    began = time.monotonic()
    await client.insert_many([Tick(n) for n in range(12)], queue="ticks")
    await _until(lambda: len(started) >= 6, 10, "the rate-limited jobs did not start")
    # One at once, then four per second: the sixth start comes a second or more later.
    assert started[5] - began >= 0.9, [round(t - began, 2) for t in started]
    await client.clear_queue_overrides("ticks")
    await _until(lambda: len(started) == 12, 5, "cleared, the jobs did not all start")
    await _until(lambda: dispatcher.config.rate_limit is None, 3, "not cleared")
    assert dispatcher.config.claim_batch_size == 256
    assert dispatcher.config.deadline_duration == 60
    assert _gauge("ticks", "claim_batch_size") == (256.0, False)
    assert _gauge("ticks", "rate") is None
    assert await _stored_limits(client) is None
    assert counter_value("awa.queue.overrides_applied", **{"awa.job.queue": "ticks"}) == applied + 3
    await client.close()


async def test_stored_values_a_worker_cannot_use_are_ignored(
    client: awa.AsyncClient, conn: Conn, caplog: pytest.LogCaptureFixture
) -> None:
    conn.execute(
        "INSERT INTO awa.queue_overrides (queue, settings) VALUES"
        " ('ticks', '{\"claim_batch_size\": -4}'), ('other', '{\"from_a_newer_release\": 1}')"
    )

    @client.task(Tick, queue="ticks")
    async def tick(job: awa.Job[Tick]) -> None:
        return None

    await client.start({"ticks": 2, "other": 2})
    runtime = client._runtime
    assert runtime is not None
    assert runtime._dispatchers["ticks"].config.claim_batch_size == 256
    assert runtime._dispatchers["other"].config == runtime.queues[1]
    assert "queue ticks: ignoring its stored overrides" in caplog.text
    await client.close()


async def test_a_cap_removed_and_set_again_does_not_wait_for_forgotten_commits() -> None:
    async def never(*args: Any) -> Any:
        raise AssertionError("not started")

    capped = QueueConfig("api", max_workers=8, global_max_running=4)
    dispatcher = QueueDispatcher(capped, claim=never, execute=never, backlogged=lambda: False)
    for _ in range(3):
        dispatcher.awaiting_commit()  # finished handlers whose completions are in a batch
    assert dispatcher._claim_size() == 0  # more than half the cap waits for its commit
    dispatcher.reconfigure(dataclasses.replace(capped, global_max_running=None))
    assert dispatcher._claim_size() == 8
    # Nothing reports those commits while no limit counts them: a cap set again later
    # starts from what runs, not from them.
    dispatcher.reconfigure(capped)
    assert dispatcher._claim_size() == 8


async def test_an_override_removes_limits_the_workers_were_started_with(
    client: awa.AsyncClient, database_url: str
) -> None:
    """``None`` (``none`` in the CLI and the UI) lifts a configured limit for the fleet;
    clearing the override puts it back."""
    running = 0
    most = 0
    release = asyncio.Event()

    @client.task(Tick, queue="ticks")
    async def tick(job: awa.Job[Tick]) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await release.wait()
        running -= 1

    await client.start(
        {"ticks": {"max_workers": 4, "global_max_running": 1, "rate_limit": (1000, 10)}}
    )
    runtime = client._runtime
    assert runtime is not None
    dispatcher = runtime._dispatchers["ticks"]
    await client.set_queue_overrides("ticks", global_max_running=None, rate_limit=None)
    await _until(lambda: dispatcher.config.global_max_running is None, 3, "cap not lifted")
    assert dispatcher.config.rate_limit is None
    assert await _stored_limits(client) is None  # awa queue stats shows no limit either
    [override] = await client.list_queue_overrides()
    assert override.settings == {"global_max_running": None, "rate_limit": None}
    await client.insert_many([Tick(n) for n in range(4)], queue="ticks")
    await _until(lambda: running == 4, 5, "the lifted cap still held the jobs back")
    release.set()
    await client.clear_queue_overrides("ticks")
    await _until(lambda: dispatcher.config.global_max_running == 1, 3, "cap not restored")
    assert dispatcher.config.rate_limit == (1000.0, 10)
    shown = ok(
        "queue",
        "overrides",
        "set",
        "ticks",
        "--key-concurrency",
        "none",
        "--rate-limit",
        "NONE",
        url=database_url,
    ).stdout
    assert (
        shown
        == "queue ticks: overrides rate_limit=none (removed), key_concurrency=none (removed)\n"
    )
    async with browse(create_app(client)) as http:
        token = await csrf(http, "/overrides")
        await post(http, "/overrides/set", token, action="set", queue="ui", rate="none")
        await post(http, "/overrides/set", token, action="set", queue="ui", key_concurrency="None")
    [_, ui] = await client.list_queue_overrides()
    assert ui.settings == {"rate_limit": None, "key_concurrency": None}
    bad = awa_cli(
        "queue", "overrides", "set", "ticks", "--global-max-running", "lots", url=database_url
    )
    assert bad.exit_code == 2
    assert "'lots' is not an integer or 'none'" in bad.stderr
    await client.close()


async def test_the_leader_trims_the_change_log_after_its_retention(
    client: awa.AsyncClient, conn: Conn
) -> None:
    from awa.overrides.duty import override_log_duty
    from awa.worker.config import RuntimeConfig
    from awa.worker.duties import leader_duties

    for n in range(5):
        await client.set_queue_overrides("api", poll_interval=n + 1, changed_by="ops")
    conn.execute(
        "UPDATE awa.queue_override_log SET changed_at = now() - interval '400 days'"
        " WHERE id IN (SELECT id FROM awa.queue_override_log ORDER BY id LIMIT 3)"
    )
    duty = override_log_duty(interval=1, retention=365 * 86400, batch_size=2)
    assert duty is not None
    async with client.connection() as leader:
        await duty.run(leader)
    left = [change.new["poll_interval"] for change in await client.queue_override_log()]
    assert left == [5.0, 4.0]
    assert override_log_duty(interval=1, retention=0, batch_size=2) is None

    async def nothing(rescued: Any) -> None:
        return None

    names = [d.name for d in leader_duties(RuntimeConfig(), on_rescued=nothing)]
    assert "override log retention" in names
    kept = RuntimeConfig(override_log_retention=0)
    assert "override log retention" not in [d.name for d in leader_duties(kept, on_rescued=nothing)]
    with pytest.raises(awa.ValidationError, match="override_log_retention"):
        RuntimeConfig(override_log_retention=-1)
