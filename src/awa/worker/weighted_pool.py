"""Weighted mode: the handler slots of one process shared among its weighted queues.

``start(global_max_workers=N)`` gives the process N slots for its weighted queues. Each
queue is guaranteed its ``min_workers``; the rest (the overflow, N minus every minimum) is
shared by weight among the queues that want it. A queue's fair share of the overflow is
``ceil(overflow * weight / total weight of contending queues)``, where a queue contends
while it asks for more or holds overflow. It is granted what it asks for, up to what is
free and up to its fair share, so a queue alone gets all of the overflow and, once others
ask, gives back what it holds beyond its share as its jobs finish.

A queue's slots in use count its jobs running and those claimed for it (buffered or being
claimed), so the N slots are never exceeded. Everything runs on the event loop's thread.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

from awa.worker.config import QueueConfig


@dataclasses.dataclass(slots=True)
class _Share:
    minimum: int
    weight: int
    in_use: int = 0
    wants_more: bool = False
    wake: Callable[[], None] | None = None

    @property
    def overflow_held(self) -> int:
        return max(0, self.in_use - self.minimum)

    @property
    def contending(self) -> bool:
        return self.wants_more or self.overflow_held > 0


class WeightedPool:
    def __init__(self, total: int, queues: Iterable[QueueConfig]) -> None:
        self._shares = {
            queue.name: _Share(queue.min_workers or 0, queue.weight)
            for queue in queues
            if queue.weighted
        }
        self.total = total
        self.overflow = total - sum(share.minimum for share in self._shares.values())

    def __contains__(self, queue: str) -> bool:
        return queue in self._shares

    def ceiling(self, queue: str) -> int:
        """The most slots ``queue`` can ever use: its minimum and the whole overflow."""
        return self._shares[queue].minimum + self.overflow

    def on_free(self, queue: str, wake: Callable[[], None]) -> None:
        """Call ``wake`` when slots free up that ``queue`` may be granted."""
        self._shares[queue].wake = wake

    def fair_share(self, queue: str) -> int:
        share = self._shares[queue]
        weights = sum(
            other.weight for other in self._shares.values() if other.contending or other is share
        )
        return math.ceil(self.overflow * share.weight / weights)

    def acquire(self, queue: str, wanted: int) -> int:
        """Take up to ``wanted`` slots for ``queue``; returns how many were granted."""
        share = self._shares[queue]
        if wanted <= 0:
            return 0
        share.wants_more = True
        granted = min(wanted, max(0, share.minimum - share.in_use))
        rest = wanted - granted
        if rest > 0:
            free = self.overflow - sum(other.overflow_held for other in self._shares.values())
            room = self.fair_share(queue) - share.overflow_held
            granted += max(0, min(rest, free, room))
        share.in_use += granted
        return granted

    def release(self, queue: str, count: int = 1, *, satisfied: bool = False) -> None:
        """Give back ``count`` slots of ``queue`` (a job finished, a claim came back short).
        ``satisfied``: the queue has no more jobs waiting, so it stops contending."""
        share = self._shares[queue]
        held = share.overflow_held
        share.in_use -= count
        if satisfied:
            share.wants_more = False
        if held > share.overflow_held or satisfied:
            # Overflow came free or the shares grew: the others may take more now.
            for name, other in self._shares.items():
                if name != queue and other.wants_more and other.wake is not None:
                    other.wake()

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {
            name: {
                "min_workers": share.minimum,
                "weight": share.weight,
                "in_use": share.in_use,
                "overflow_held": share.overflow_held,
            }
            for name, share in self._shares.items()
        }
