"""The clients: ``AsyncClient`` (producer, operator, worker) and the blocking ``Client``
(producer, operator), and the transactions they open. Imports everything below the testing
helpers."""

from awa.client.asyncio_client import AsyncClient
from awa.client.blocking import Client
from awa.client.transaction import SyncTransaction, Transaction

__all__ = ["AsyncClient", "Client", "SyncTransaction", "Transaction"]
