"""Periodic jobs as methods of both clients: the operator's actions of
``awa.periodic.operations`` on a pooled connection (declaring them, ``periodic()``, is the
asyncio client's: its worker stores them)."""

from __future__ import annotations

from awa.periodic import operations as ops
from awa.storage.calls import operation_method


class PeriodicMethods:
    """Mixin of both clients: the stored periodic jobs (the reference's ``cron`` names)."""

    list_cron_jobs = operation_method(ops.list_cron_jobs)
    pause_cron_job = operation_method(ops.pause_cron_job)
    resume_cron_job = operation_method(ops.resume_cron_job)
    trigger_cron_job = operation_method(ops.trigger_cron_job)
    delete_cron_job = operation_method(ops.delete_cron_job)
