"""pytest fixtures for applications that use awa (needs pytest-asyncio).

Enable them in your ``conftest.py``::

    pytest_plugins = ["awa.testing_fixtures"]

- ``awa_database_url``: ``AWA_TEST_DATABASE_URL``, else ``DATABASE_URL``, else the PG*
  variables, else the embedded server. Override the fixture to choose another database.
- ``awa_client``: an ``awa.AsyncClient`` on it, migrated, closed after the test.
- ``awa_test_client``: an ``awa.testing.AwaTestClient`` around ``awa_client``. It empties
  awa's tables before each test, so point it at a database kept for tests.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from awa.client.asyncio_client import AsyncClient
from awa.storage.db import resolve_database_url
from awa.testing import AwaTestClient


@pytest.fixture(scope="session")
def awa_database_url() -> str:
    """The database the awa fixtures use."""
    return resolve_database_url(os.environ.get("AWA_TEST_DATABASE_URL"))


@pytest_asyncio.fixture
async def awa_client(awa_database_url: str) -> AsyncIterator[AsyncClient]:
    """A migrated ``awa.AsyncClient``; register tasks, hooks and follow-ups on it."""
    async with AsyncClient(awa_database_url) as client:
        await client.migrate()
        yield client


@pytest_asyncio.fixture
async def awa_test_client(awa_client: AsyncClient) -> AwaTestClient:
    """An ``AwaTestClient`` over ``awa_client``, on emptied awa tables."""
    harness = AwaTestClient(awa_client)
    await harness.clean()
    return harness
