"""AsyncClient and Client: shared methods, transactions; imports every layer below testing."""

from awa.client.asyncio_client import AsyncClient
from awa.client.blocking import Client
from awa.client.transaction import SyncTransaction, Transaction

__all__ = ["AsyncClient", "Client", "SyncTransaction", "Transaction"]
