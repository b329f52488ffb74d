"""The shortest path through the producer API, against the real database."""

from __future__ import annotations

import dataclasses

import awa


@dataclasses.dataclass
class SendEmail:
    to: str


async def test_insert_and_read_back(client: awa.AsyncClient) -> None:
    job = await client.insert(SendEmail("a@example.com"))
    assert job.kind == "send_email"
    assert job.state is awa.JobState.AVAILABLE
    fetched = await client.get_job(job.id)
    assert fetched is not None
    assert fetched.args == {"to": "a@example.com"}


def test_sync_insert(sync_client: awa.Client) -> None:
    job = sync_client.insert(SendEmail("b@example.com"), queue="mail")
    assert job.queue == "mail"
    assert sync_client.get_job(job.id) == job
