"""Workflows, batches, waiting: plans, operations, methods; imports job and below, no capability."""

from awa.workflows.methods import WaitTimeout
from awa.workflows.operations import BatchRun, Step, Workflow, WorkflowInfo, WorkflowRun

__all__ = ["BatchRun", "Step", "WaitTimeout", "Workflow", "WorkflowInfo", "WorkflowRun"]
