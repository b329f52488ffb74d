"""Periodic jobs: declared schedules and their fires (``schedules``), the operator's actions
on them (``operations``, whose ``CronJob`` and ``*_cron_job*`` names are the reference's) and
the leader duty that fires them (``duty``). Imports the producer, lifecycle and below; no
other capability."""

from awa.periodic.jobs import PeriodicJob
from awa.periodic.operations import CronJob

__all__ = ["CronJob", "PeriodicJob"]
