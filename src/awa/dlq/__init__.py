"""The dead-letter queue: its entries and operations on any connection (``operations``) and
the clients' DLQ methods (``methods``). Imports the producer, lifecycle and below; no other
capability."""

from awa.dlq.operations import DlqEntry

__all__ = ["DlqEntry"]
