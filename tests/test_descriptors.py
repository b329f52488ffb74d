"""Descriptors of queues and job kinds: declared before start, validated, stored when the
worker starts (blank rows for the rest), kept fresh and pruned by the leader, and read
through awa.admin, the clients, the CLI and the UI's overview."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

import awa
from awa.cli import main
from awa.descriptors.operations import Descriptor
from awa.ui import create_app
from helpers_ui import browse, text
from helpers_worker import queue, start, wait_for
from jobs_helpers import Conn


@dataclasses.dataclass
class SendEmail:
    to: str


@dataclasses.dataclass
class ChargeCard:
    order: int


def clear_catalog(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DELETE FROM awa.queue_descriptors; DELETE FROM awa.job_kind_descriptors")


@pytest.fixture(autouse=True)
def empty_catalog(database_url: str) -> Iterator[None]:
    """The session database shares these tables between tests: start and end empty."""
    clear_catalog(database_url)
    yield
    clear_catalog(database_url)


def described(client: awa.AsyncClient) -> None:
    """Tasks on email and billing; descriptors for the email queue and the send_email kind."""

    @client.task(SendEmail, queue="email")
    async def send(job: awa.Job[SendEmail]) -> None:
        return None

    @client.task(ChargeCard, queue="billing")
    async def charge(job: awa.Job[ChargeCard]) -> None:
        return None

    client.queue_descriptor(
        "email",
        display_name="Outbound email",
        description="Every message we send to users.",
        owner="growth@example.com",
        docs_url="https://runbooks.example.com/email",
        tags=["user-facing", "smtp"],
        extra={"team": "growth", "pager": {"rotation": 2}},
    )
    client.job_kind_descriptor(
        "send_email", display_name="Send one email", owner="growth@example.com", tags=["smtp"]
    )


def db_now(conn: Conn) -> dt.datetime:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    value: dt.datetime = row[0]
    return value


async def test_stored_at_start_with_blank_rows_for_the_rest(
    client: awa.AsyncClient, conn: Conn
) -> None:
    described(client)
    before = db_now(conn)
    await start(client, {**queue("email"), **queue("billing")})
    queues = {row.queue: row for row in awa.admin.list_queue_descriptors(conn)}
    assert set(queues) == {"email", "billing"}
    email = queues["email"]
    assert (email.display_name, email.owner) == ("Outbound email", "growth@example.com")
    assert email.description == "Every message we send to users."
    assert email.docs_url == "https://runbooks.example.com/email"
    assert email.tags == ["user-facing", "smtp"]
    assert email.extra == {"team": "growth", "pager": {"rotation": 2}}
    assert email.declared
    assert email.descriptor_hash
    assert len(email.descriptor_hash) == 64
    assert email.live
    assert email.last_seen_at >= before
    billing = queues["billing"]
    assert not billing.declared
    assert billing.descriptor_hash is None
    assert (billing.display_name, billing.tags, billing.extra) == (None, [], {})
    assert billing.live

    kinds = {row.kind: row for row in awa.admin.list_job_kind_descriptors(conn)}
    assert set(kinds) == {"send_email", "charge_card"}
    assert kinds["send_email"].display_name == "Send one email"
    assert (kinds["send_email"].queue, kinds["charge_card"].queue) == ("email", "billing")
    assert not kinds["charge_card"].declared
    # The same descriptor always hashes alike (the reference package's BLAKE3 of canonical
    # JSON), so two workers declaring it store the same hash.
    same = Descriptor.of(
        display_name="Outbound email",
        description="Every message we send to users.",
        owner="growth@example.com",
        docs_url="https://runbooks.example.com/email",
        tags=["user-facing", "smtp"],
        extra={"pager": {"rotation": 2}, "team": "growth"},
    )
    assert same.descriptor_hash == email.descriptor_hash


async def test_a_blank_row_keeps_a_declared_descriptor_and_restarts_refresh_it(
    client: awa.AsyncClient, database_url: str, conn: Conn
) -> None:
    described(client)
    await start(client, queue("email"))
    await client.shutdown()
    first = awa.admin.list_queue_descriptors(conn, queue="email")[0]

    # Another deployment runs the queue without describing it: the descriptor stays.
    async with awa.AsyncClient(database_url) as plain:

        @plain.task(SendEmail, queue="email")
        async def send(job: awa.Job[SendEmail]) -> None:
            return None

        await start(plain, queue("email"))
        await plain.shutdown()
    second = awa.admin.list_queue_descriptors(conn, queue="email")[0]
    assert second.display_name == "Outbound email"
    assert second.descriptor_hash == first.descriptor_hash
    assert second.last_seen_at > first.last_seen_at
    assert second.updated_at == first.updated_at

    # A changed declaration replaces the fields; declaring nothing but the queue blanks them.
    async with awa.AsyncClient(database_url) as changed:

        @changed.task(SendEmail, queue="email")
        async def send_again(job: awa.Job[SendEmail]) -> None:
            return None

        changed.queue_descriptor("email", display_name="Email, v2")
        await start(changed, queue("email"))
        await changed.shutdown()
    third = awa.admin.list_queue_descriptors(conn, queue="email")[0]
    assert third.display_name == "Email, v2"
    assert third.owner is None
    assert third.tags == []
    assert third.descriptor_hash != first.descriptor_hash
    assert third.updated_at > first.updated_at


async def test_declared_only_before_start(client: awa.AsyncClient) -> None:
    described(client)
    await start(client, queue("email"))
    with pytest.raises(awa.AwaError, match=r"queue_descriptor\(\) must be called before start"):
        client.queue_descriptor("email", display_name="too late")
    with pytest.raises(awa.AwaError, match=r"job_kind_descriptor\(\) must be called before"):
        client.job_kind_descriptor("send_email", display_name="too late")


async def test_a_descriptor_of_an_unknown_queue_fails_start(
    client: awa.AsyncClient, conn: Conn
) -> None:
    described(client)
    client.queue_descriptor("emial", display_name="a typo")
    with pytest.raises(awa.ValidationError, match="descriptor declared for unknown queue 'emial'"):
        await start(client, queue("email"))
    assert client.runtime is None
    assert awa.admin.list_queue_descriptors(conn) == []


async def test_a_fleet_split_by_queue_stores_what_each_worker_runs(
    client: awa.AsyncClient, conn: Conn
) -> None:
    described(client)
    client.queue_descriptor("billing", display_name="Billing")
    # This process runs email only: the billing descriptor is the billing worker's to store.
    await start(client, queue("email"))
    assert [row.queue for row in awa.admin.list_queue_descriptors(conn)] == ["email"]
    # Every kind the client registers is stored, whichever queue it runs.
    kinds = [row.kind for row in awa.admin.list_job_kind_descriptors(conn)]
    assert kinds == ["charge_card", "send_email"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"display_name": "x" * 201}, "display_name is 201 characters long; the limit is 200"),
        ({"display_name": 7}, "display_name must be a string"),
        ({"description": "x" * 2001}, "description is 2001 characters long; the limit is 2000"),
        ({"owner": "x" * 201}, "owner is 201 characters long; the limit is 200"),
        ({"owner": "a\x00b"}, "owner contains a NUL byte"),
        ({"docs_url": "javascript:alert(1)"}, "docs_url must be an http:// or https:// URL"),
        ({"docs_url": "ftp://files.example.com/x"}, "docs_url must be an http"),
        ({"docs_url": "https://"}, "docs_url must be an http"),
        ({"docs_url": "https://x.example/" + "a" * 2040}, "docs_url is 2058 characters long"),
        ({"tags": ["t"] * 21}, "21 tags given; the limit is 20"),
        ({"tags": "one-string"}, "tags must be a list of strings"),
        ({"tags": [3]}, "tags must be strings"),
        ({"tags": [""]}, "descriptor tags must be 1 to 200 characters"),
        ({"extra": ["not", "an", "object"]}, "extra must be a dict"),
        ({"extra": {"ratio": float("nan")}}, "NaN or infinite"),
        ({"extra": {"when": object()}}, "extra cannot be converted to JSON"),
        ({"extra": {"blob": "x" * 70_000}}, "the limit is 65536"),
    ],
)
async def test_descriptor_validation(
    client: awa.AsyncClient, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(awa.ValidationError, match=re.escape(message)):
        client.queue_descriptor("email", **fields)
    with pytest.raises(awa.ValidationError, match=re.escape(message)):
        client.job_kind_descriptor("send_email", **fields)


async def test_names_are_validated(client: awa.AsyncClient) -> None:
    with pytest.raises(awa.ValidationError, match="queue must not be empty"):
        client.queue_descriptor("", display_name="x")
    with pytest.raises(awa.ValidationError, match="kind is 201 characters long"):
        client.job_kind_descriptor("k" * 201, display_name="x")


def test_descriptor_retention_setting() -> None:
    assert awa.RuntimeConfig().descriptor_retention == 30 * 86400
    assert awa.RuntimeConfig(descriptor_retention=dt.timedelta(days=2)).descriptor_retention == (
        2 * 86400
    )
    assert awa.RuntimeConfig(descriptor_retention=0).descriptor_retention == 0  # for ever
    with pytest.raises(awa.ValidationError, match="descriptor_retention must be >= 0"):
        awa.RuntimeConfig(descriptor_retention=-1)
    with pytest.raises(awa.ValidationError, match="descriptor_retention must be a finite"):
        awa.RuntimeConfig(descriptor_retention=float("inf"))


def seen(conn: Conn, table: str, key: str, name: str) -> dt.datetime | None:
    """When the row was last seen (None: there is no row)."""
    row = conn.execute(f"SELECT last_seen_at FROM awa.{table} WHERE {key} = %s", (name,))
    found = row.fetchone()
    return None if found is None else found[0]


def fresh(conn: Conn, table: str, key: str, name: str) -> bool:
    """Whether the row was seen in the last minute."""
    row = conn.execute(
        f"SELECT last_seen_at > now() - interval '1 minute' FROM awa.{table} WHERE {key} = %s",
        (name,),
    ).fetchone()
    return bool(row and row[0])


def age(conn: Conn, table: str, where: str, days: int) -> None:
    """Make the matching rows look last seen ``days`` ago."""
    conn.execute(
        f"UPDATE awa.{table} SET last_seen_at = now() - make_interval(days => {days}) WHERE {where}"
    )


async def test_the_leader_prunes_unseen_rows_and_refreshes_running_ones(
    client: awa.AsyncClient, conn: Conn
) -> None:
    conn.execute(
        "INSERT INTO awa.queue_descriptors (queue, display_name, last_seen_at)"
        " VALUES ('retired', 'Gone', now() - interval '3 days')"
    )
    conn.execute(
        "INSERT INTO awa.job_kind_descriptors (kind, queue, last_seen_at)"
        " VALUES ('retired_kind', 'retired', now() - interval '3 days')"
    )
    described(client)
    await start(client, queue("email"), descriptor_retention=86400, cleanup_interval=0.1)
    # The running queue's rows were seen long ago too: the leader refreshes them instead.
    age(conn, "queue_descriptors", "queue <> 'retired'", 2)
    age(conn, "job_kind_descriptors", "kind <> 'retired_kind'", 2)

    await wait_for(
        lambda: (
            seen(conn, "queue_descriptors", "queue", "retired") is None
            and seen(conn, "job_kind_descriptors", "kind", "retired_kind") is None
        ),
        message="the leader never pruned the retired descriptors",
    )
    await wait_for(
        lambda: (
            fresh(conn, "queue_descriptors", "queue", "email")
            and fresh(conn, "job_kind_descriptors", "kind", "send_email")
        ),
        message="the leader never refreshed the running queue's descriptors",
    )
    assert awa.admin.list_queue_descriptors(conn, queue="email")[0].display_name == (
        "Outbound email"
    )
    # A kind whose task's queue no live worker runs is not refreshed: unseen for longer than
    # the retention, it went too.
    assert seen(conn, "job_kind_descriptors", "kind", "charge_card") is None


async def test_retention_zero_keeps_descriptors_for_ever(
    client: awa.AsyncClient, conn: Conn
) -> None:
    conn.execute(
        "INSERT INTO awa.queue_descriptors (queue, last_seen_at)"
        " VALUES ('ancient', now() - interval '400 days')"
    )
    described(client)
    await start(client, queue("email"), descriptor_retention=0, cleanup_interval=0.1)
    for _ in range(2):  # two sweeps: had the first one pruned, it would be done by now
        age(conn, "queue_descriptors", "queue = 'email'", 2)
        await wait_for(
            lambda: fresh(conn, "queue_descriptors", "queue", "email"),
            message="the leader never refreshed the email descriptor",
        )
    assert seen(conn, "queue_descriptors", "queue", "ancient") is not None


async def test_listed_by_admin_clients_and_cli(
    client: awa.AsyncClient, sync_client: awa.Client, database_url: str, conn: Conn
) -> None:
    described(client)
    await start(client, {**queue("email"), **queue("billing")})

    assert [row.queue for row in await client.list_queue_descriptors()] == ["billing", "email"]
    assert [row.kind for row in await client.list_job_kind_descriptors(kind="send_email")] == [
        "send_email"
    ]
    assert [row.queue for row in sync_client.list_queue_descriptors(queue="email")] == ["email"]
    assert len(sync_client.list_job_kind_descriptors()) == 2
    async with client.connection() as aconn:
        rows = await awa.admin.list_queue_descriptors(aconn, queue="nope")
    assert rows == []

    runner = CliRunner()
    table = runner.invoke(main, ["--database-url", database_url, "queue", "descriptors"])
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["QUEUE", "DISPLAY", "NAME", "OWNER", "TAGS", "LIVE", "LAST", "SEEN"]
    email_line = next(line for line in lines if line.startswith("email"))
    assert "Outbound email" in email_line
    assert "growth@example.com" in email_line
    assert "user-facing, smtp" in email_line
    assert " yes " in email_line

    as_json = runner.invoke(
        main, ["--database-url", database_url, "queue", "descriptors", "email", "--json"]
    )
    assert as_json.exit_code == 0, as_json.output
    [email] = json.loads(as_json.stdout)
    assert email["description"] == "Every message we send to users."
    assert email["extra"] == {"team": "growth", "pager": {"rotation": 2}}
    assert email["declared"] is True
    assert email["live"] is True

    kinds = runner.invoke(main, ["--database-url", database_url, "job", "kinds"])
    assert kinds.exit_code == 0, kinds.output
    assert re.search(r"send_email\s+email\s+Send one email", kinds.stdout), kinds.stdout
    assert re.search(r"charge_card\s+billing\s+-", kinds.stdout), kinds.stdout
    kinds_json = runner.invoke(
        main, ["--database-url", database_url, "job", "kinds", "charge_card", "--json"]
    )
    assert [row["declared"] for row in json.loads(kinds_json.stdout)] == [False]


def test_cli_says_when_there_are_none(database_url: str) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["--database-url", database_url, "queue", "descriptors"])
    assert result.exit_code == 0
    assert "no queue descriptors yet" in result.stdout
    result = runner.invoke(main, ["--database-url", database_url, "job", "kinds", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == []


async def test_the_ui_overview_shows_a_queues_descriptor(
    client: awa.AsyncClient, conn: Conn
) -> None:
    described(client)
    await start(client, {**queue("email"), **queue("billing")})
    # A row written by other means with a script URL: shown as text, never as a link.
    conn.execute(
        "UPDATE awa.queue_descriptors SET display_name = 'Billing', docs_url = %s"
        " WHERE queue = 'billing'",
        ("javascript:alert(1)",),
    )
    async with browse(create_app(client)) as http:
        page = await http.get("/")
    assert page.status_code == 200, page.text
    row = re.search(r'<tr data-queue="email">(.*?)</tr>', page.text, re.S)
    assert row is not None, page.text
    cells = text(row.group(1))
    assert cells.startswith("email Outbound email · growth@example.com docs"), cells
    assert "Every message we send to users." in cells
    assert 'href="https://runbooks.example.com/email"' in row.group(1)
    billing = re.search(r'<tr data-queue="billing">(.*?)</tr>', page.text, re.S)
    assert billing is not None
    assert text(billing.group(1)).startswith("billing Billing 0")
    assert "javascript:" not in billing.group(1)
