"""A leader duty's shape: capabilities build their duties with it, and the worker's
maintenance leader runs them (the seam that keeps capabilities below the worker)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from awa.core.outage import FailureLog


@dataclasses.dataclass(slots=True)
class Duty:
    """A periodic task of the leader, run on the leader's connection."""

    name: str
    interval: float
    run: Callable[[psycopg.AsyncConnection[Any]], Awaitable[None]]
    next_at: float = 0.0
    failures: FailureLog | None = None
