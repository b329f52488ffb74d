"""Dead-letter queue: entries, operations, retention duty; imports job and below, no capability."""

from awa.dlq.operations import DlqEntry

__all__ = ["DlqEntry"]
