"""Periodic jobs: timing, operator actions, firing duty; imports job and below, no capability."""

from awa.periodic.jobs import PeriodicJob
from awa.periodic.operations import CronJob

__all__ = ["CronJob", "PeriodicJob"]
