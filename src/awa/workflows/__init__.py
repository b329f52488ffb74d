"""Workflows and batches (jobs with dependencies, inserted atomically) and waiting for jobs:
the types, plans and statements (``operations``) and the clients' methods (``methods``).
Imports the producer, lifecycle and below; no other capability."""

from awa.workflows.methods import WaitTimeout
from awa.workflows.operations import BatchRun, Step, Workflow, WorkflowInfo, WorkflowRun

__all__ = ["BatchRun", "Step", "WaitTimeout", "Workflow", "WorkflowInfo", "WorkflowRun"]
