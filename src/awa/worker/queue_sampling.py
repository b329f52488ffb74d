"""The leader's queue sample: every ``queue_sample_interval`` seconds it counts each queue's
live jobs by state and finds its oldest available job, in one statement, and stores the
result in ``awa.queue_samples`` for the queue gauges of every process.

The count reads every live row, so on a large backlog it takes a while: the duty stretches
its interval to twenty times the last count's duration, so it never spends more than about
5 % of the leader's time (and one connection) counting. Scrapes never count.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from awa.core.duty import Duty
from awa.observability.queue_samples import store_queue_samples

# The share of time the leader may spend counting: the interval is at least this many
# times the last count's duration.
SAMPLING_SLACK = 20


def queue_sampling_duty(interval: float) -> Duty:
    async def sample(conn: psycopg.AsyncConnection[Any]) -> None:
        started = time.monotonic()
        await store_queue_samples(conn)
        duty.interval = max(interval, SAMPLING_SLACK * (time.monotonic() - started))

    duty = Duty("queue sampling", interval, sample)
    return duty
