"""The attempts this process is running, shared with the heartbeat thread."""

from __future__ import annotations

from typing import Any

from awa.job import Job


class InFlight:
    """Attempts claimed by this process and not yet finalized, keyed by job id.

    Written by the event loop only; the heartbeat thread reads ``snapshot()``, a copy taken
    in one step (dict.copy is atomic under the GIL).
    """

    def __init__(self) -> None:
        self._jobs: dict[int, Job[Any]] = {}

    def add(self, job: Job[Any]) -> None:
        self._jobs[job.id] = job

    def remove(self, job: Job[Any]) -> None:
        current = self._jobs.get(job.id)
        if current is job:
            del self._jobs[job.id]

    def snapshot(self) -> list[Job[Any]]:
        return list(self._jobs.copy().values())

    def cancel(self, job_id: int, run_lease: int | None = None) -> Job[Any] | None:
        """Flip ``is_cancelled()`` of the matching attempt and return it; None when it is
        not ours."""
        job = self._jobs.get(job_id)
        if job is None or (run_lease is not None and job.run_lease != run_lease):
            return None
        job._cancelled = True
        return job

    def cancel_all(self) -> None:
        for job in self.snapshot():
            job._cancelled = True

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._jobs
