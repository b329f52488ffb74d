"""``awa callback complete|fail|retry|resume|resolve|heartbeat ID``: admin-level answers to a
callback (the row changes; no hooks, no follow-ups), checked against the database; the help
of the ``awa callback`` group; the deprecated ``awa callbacks serve`` alias. ``awa callback
serve`` itself is tested on a socket in test_callbacks_http.py."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from click.testing import CliRunner, Result

import awa
from awa.cli import main
from helpers_callbacks import Payment
from helpers_worker import row
from jobs_helpers import Conn


def awa_cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--database-url", url, *args], catch_exceptions=False)


def ok(url: str, *args: str) -> Result:
    result = awa_cli(url, *args)
    assert result.exit_code == 0, result.output
    return result


def park(sync_client: awa.Client, conn: Conn, **expressions: str) -> tuple[int, str]:
    """A job parked on a fresh callback (written with SQL as a worker would)."""
    job = sync_client.insert(Payment(), queue="nobody-works-this")
    callback_id = str(uuid.uuid4())
    conn.execute(
        "UPDATE awa.jobs SET state = 'waiting_external', attempt = 1, run_lease = 1,"
        " callback_id = %s, callback_timeout_at = now() + interval '1 hour',"
        " callback_on_complete = %s, callback_transform = %s WHERE id = %s",
        (
            callback_id,
            expressions.get("on_complete"),
            expressions.get("transform"),
            job.id,
        ),
    )
    return job.id, callback_id


def test_complete(database_url: str, sync_client: awa.Client, conn: Conn) -> None:
    job_id, cb = park(sync_client, conn)
    result = ok(database_url, "callback", "complete", cb, "--payload", '{"paid": true}')
    assert result.output.strip() == f"job {job_id} is now completed"
    db = row(conn, job_id)
    assert db["state"] == "completed"
    assert db["output"] == {"paid": True}
    assert db["callback_id"] is None


def test_complete_json_and_run_lease(
    database_url: str, sync_client: awa.Client, conn: Conn
) -> None:
    job_id, cb = park(sync_client, conn)
    missed = awa_cli(database_url, "callback", "complete", cb, "--run-lease", "7")
    assert missed.exit_code == 1
    assert "callback not found" in missed.stderr
    assert row(conn, job_id)["state"] == "waiting_external"
    result = ok(database_url, "callback", "complete", cb, "--run-lease", "1", "--json")
    answer = json.loads(result.stdout)
    assert answer["id"] == job_id
    assert answer["state"] == "completed"


def test_fail(database_url: str, sync_client: awa.Client, conn: Conn) -> None:
    job_id, cb = park(sync_client, conn)
    assert awa_cli(database_url, "callback", "fail", cb).exit_code == 2  # --error is required
    ok(database_url, "callback", "fail", cb, "--error", "card declined")
    db = row(conn, job_id)
    assert db["state"] == "failed"
    assert db["errors"][-1]["error"] == "card declined"
    assert db["errors"][-1]["terminal"] is True


def test_retry(database_url: str, sync_client: awa.Client, conn: Conn) -> None:
    job_id, cb = park(sync_client, conn)
    result = ok(database_url, "callback", "retry", cb)
    assert result.output.strip() == f"job {job_id} is now available"
    db = row(conn, job_id)
    assert db["attempt"] == 0
    assert db["callback_id"] is None


def test_resume(database_url: str, sync_client: awa.Client, conn: Conn) -> None:
    job_id, cb = park(sync_client, conn)
    ok(database_url, "callback", "resume", cb, "--payload", "[1, 2]")
    db = row(conn, job_id)
    assert db["state"] == "available"
    assert db["metadata"]["_awa_callback_result"] == [1, 2]


def test_resolve(database_url: str, sync_client: awa.Client, conn: Conn) -> None:
    job_id, cb = park(sync_client, conn, on_complete="payload.ok", transform="payload.n")
    ignored = ok(database_url, "callback", "resolve", cb, "--payload", '{"ok": false}')
    assert ignored.output.strip() == "ignored: no expressions configured, default is ignore"
    assert row(conn, job_id)["state"] == "waiting_external"
    done = ok(database_url, "callback", "resolve", cb, "--payload", '{"ok": true, "n": 3}')
    assert done.output.strip() == f"completed: job {job_id} is now completed"
    assert row(conn, job_id)["output"] == 3
    other_id, other = park(sync_client, conn)
    result = ok(database_url, "callback", "resolve", other, "--default-action", "fail", "--json")
    answer: dict[str, Any] = json.loads(result.stdout)
    assert answer["outcome"] == "failed"
    assert answer["job"]["state"] == "failed"
    assert row(conn, other_id)["state"] == "failed"


def test_heartbeat(database_url: str, sync_client: awa.Client, conn: Conn) -> None:
    job_id, cb = park(sync_client, conn)
    before = row(conn, job_id)["callback_timeout_at"]
    result = ok(database_url, "callback", "heartbeat", cb, "--timeout", "86400")
    assert "times out at" in result.output
    assert (row(conn, job_id)["callback_timeout_at"] - before).total_seconds() > 80000


def test_errors(database_url: str, sync_client: awa.Client, conn: Conn) -> None:
    job_id, cb = park(sync_client, conn)
    bad_json = awa_cli(database_url, "callback", "complete", cb, "--payload", "{nope")
    assert bad_json.exit_code == 2
    assert "not valid JSON" in bad_json.stderr
    bad_id = awa_cli(database_url, "callback", "complete", "not-a-uuid")
    assert bad_id.exit_code == 2  # bad input: a usage error
    assert bad_id.stderr.startswith("error: callback id 'not-a-uuid' is not a UUID")
    unknown = awa_cli(database_url, "callback", "complete", str(uuid.uuid4()))
    assert unknown.exit_code == 1
    assert unknown.stderr.startswith("error: callback not found")
    assert "Traceback" not in unknown.output
    assert row(conn, job_id)["state"] == "waiting_external"


# help and the deprecated alias ---------------------------------------------------------------


COMMANDS = ["complete", "fail", "retry", "resume", "resolve", "heartbeat", "serve"]


def help_text(*args: str) -> str:
    result = CliRunner().invoke(main, [*args, "--help"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return " ".join(result.stdout.split())  # unwrapped


def commands_listed(*args: str) -> dict[str, str]:
    """The commands a group's help lists, with their one-line summaries."""
    text = CliRunner().invoke(main, [*args, "--help"]).stdout
    lines = text.split("Commands:")[1].strip().splitlines()
    return dict(line.strip().split(maxsplit=1) for line in lines)


def test_one_group_lists_every_command_with_a_full_sentence() -> None:
    listed = commands_listed("callback")
    assert sorted(listed) == sorted(COMMANDS)
    for summary in listed.values():
        assert summary.endswith(".")
        assert not summary.endswith("...")  # no summary cut short
    group = help_text("callback")
    assert "no lifecycle hook and no follow-up job fires" in group
    assert "awa callback serve MODULE:CLIENT" in group
    top = commands_listed()
    assert "callback" in top
    assert "callbacks" not in top  # the deprecated alias stays out of the help


@pytest.mark.parametrize(
    ("command", "phrases"),
    [
        ("complete", ["ID", "--payload", "becomes its output", "no Completed event"]),
        ("fail", ["ID", "--error", "terminal error", "no Exhausted event"]),
        ("retry", ["ID", "Parked jobs only", "attempt 0", "no Retried event"]),
        ("resume", ["ID", "job.callback_result", "wait_for_callback()", "fires nothing"]),
        ("resolve", ["ID", "on_fail", "--default-action", "Fires nothing"]),
        ("heartbeat", ["ID", "--timeout SECONDS", "Parked jobs only", "Fires nothing"]),
        ("serve", ["MODULE:CLIENT", "hooks run", "fires nothing", "--allow-unsigned"]),
    ],
)
def test_each_command_says_what_it_takes_and_what_fires(command: str, phrases: list[str]) -> None:
    text = help_text("callback", command)
    for phrase in phrases:
        assert phrase in text, (phrase, text)


def test_callbacks_serve_is_a_deprecated_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWA_CALLBACK_SECRET", raising=False)
    result = CliRunner().invoke(main, ["callbacks", "serve", "--port", "1"], prog_name="awa")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "awa: `awa callbacks serve` is deprecated; use `awa callback serve`",
        "error: give --secret (or AWA_CALLBACK_SECRET), or --allow-unsigned, or "
        "--callback-hmac-secret (or AWA_CALLBACK_HMAC_SECRET) for awa-pg's contract only "
        "(see 'awa callbacks serve --help')",
    ]
    assert "Deprecated: use `awa callback serve`." in help_text("callbacks", "serve")
