"""Live queue overrides: settings operators change for a running fleet, per queue, stored in
the database (``operations``: the types, checks and statements on any connection). Imports
the core and below; no other capability."""

from awa.overrides.operations import OverrideChange, QueueOverrides

__all__ = ["OverrideChange", "QueueOverrides"]
