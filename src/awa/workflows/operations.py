"""Workflows and batches: several jobs with dependencies between them, inserted atomically.

``awa.Workflow(name)`` collects steps (``wf.add(args, depends_on=[...], **options)``, which
returns a handle later steps depend on); ``client.insert_workflow(wf)`` inserts them in one
transaction, each recording the workflow's id. ``client.insert_batch(members,
on_complete=...)`` is a workflow of N members and one fan-in job that depends on all of them
with ``on_dependency_failure="run"``: it runs exactly once, after every member finished
whatever its outcome, and finds the members' ids and counts by final state in its metadata
under ``awa:batch``, written in the transaction that finished the last member.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from awa.core.arguments import uuid_from
from awa.errors import ValidationError
from awa.model import DEPENDENCY_POLICIES, EnqueueRequest, JobRow, check_name, dependency_ids
from awa.producer.backpressure import guarded_flow
from awa.producer.dependencies import dependencies_flow
from awa.producer.insert import InsertRules, PreparedJob, prepare_job, split_kwargs
from awa.producer.statements import dependency_preflight_flow, insert_flow
from awa.sql import query
from awa.storage.db import Flow, Statement

WORKFLOW = "awa:workflow"
"""Metadata key of a workflow's jobs: ``{"id", "name", "step"}``."""
FAN_IN = "awa:fan_in"
"""Metadata key marking a batch's fan-in job (its summary goes under ``BATCH``)."""
BATCH = "awa:batch"
"""Metadata key of the summary a fan-in job receives: ``{"counts": {state: n}, "ids":
{state: [ids]}}`` over its members' final states."""


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """A handle on one job of a workflow, for later steps' ``depends_on`` and to find the
    inserted row (``run[step]``)."""

    workflow: uuid.UUID
    index: int


@dataclasses.dataclass(slots=True)
class _Planned:
    args: Any
    kwargs: dict[str, Any]
    steps: tuple[int, ...]
    external: tuple[int, ...]
    policy: str
    metadata: dict[str, Any]


class Workflow:
    """Jobs and the dependencies between them, to insert together."""

    def __init__(self, name: str) -> None:
        self.name = check_name("workflow name", name)
        self.id = uuid.uuid4()
        self._planned: list[_Planned] = []

    def add(
        self,
        args: Any,
        *,
        depends_on: Iterable[Step | JobRow | int] = (),
        on_dependency_failure: str = "cancel",
        **options: Any,
    ) -> Step:
        """Add a job; ``depends_on`` names earlier steps of this workflow or jobs that
        exist already; ``options`` are those of ``insert`` (queue, priority, ...)."""
        if on_dependency_failure not in DEPENDENCY_POLICIES:
            raise ValidationError(
                f"on_dependency_failure must be one of {', '.join(DEPENDENCY_POLICIES)}, "
                f"not {on_dependency_failure!r}"
            )
        if "depends_on" in options or "on_dependency_failure" in options:
            raise ValidationError("give depends_on to add(), once")
        if isinstance(depends_on, str | bytes | Mapping) or not isinstance(depends_on, Iterable):
            raise ValidationError("depends_on must be a list of steps, jobs or job ids")
        steps: list[int] = []
        external: list[Any] = []
        for parent in depends_on:
            if isinstance(parent, Step):
                if parent.workflow != self.id:
                    raise ValidationError("depends_on names a step of another workflow")
                if isinstance(parent.index, bool) or not isinstance(parent.index, int):
                    raise ValidationError(
                        f"depends_on names a step whose index is {parent.index!r}"
                    )
                steps.append(parent.index)
            else:
                external.append(parent)
        metadata = {WORKFLOW: {"id": str(self.id), "name": self.name, "step": len(self._planned)}}
        split_kwargs("add", options)  # unknown options fail here, naming them
        self._planned.append(
            _Planned(
                args,
                dict(options),
                tuple(dict.fromkeys(steps)),
                dependency_ids(external) or (),
                on_dependency_failure,
                metadata,
            )
        )
        return Step(self.id, len(self._planned) - 1)

    def __len__(self) -> int:
        return len(self._planned)

    def _mark(self, step: Step, key: str, value: Any) -> None:
        self._planned[step.index].metadata[key] = value

    def check_steps(self) -> None:
        """Raise ValidationError naming the steps when one depends on a step that does not
        exist, or when steps depend on each other in a cycle (they would wait for ever)."""
        count = len(self._planned)
        if not count:
            raise ValidationError(f"workflow {self.name!r} has no jobs")
        for index, planned in enumerate(self._planned):
            for parent in planned.steps:
                if not 0 <= parent < count:
                    raise ValidationError(
                        f"workflow {self.name!r}: step {index} depends on step {parent}, which "
                        f"does not exist (the steps are 0 to {count - 1})"
                    )
                if parent == index:
                    raise ValidationError(f"workflow {self.name!r}: step {index} depends on itself")
        cycle = _cycle([planned.steps for planned in self._planned])
        if cycle:
            path = " -> ".join(str(step) for step in cycle)
            raise ValidationError(
                f"workflow {self.name!r}: steps {path} depend on each other in a cycle, so "
                "none of them could ever run"
            )

    def prepare(self, rules: InsertRules) -> list[PreparedJob]:
        """The steps as jobs (validated), in the order they were added."""
        self.check_steps()
        prepared = []
        for index, planned in enumerate(self._planned):
            kind, opts = split_kwargs("add", planned.kwargs)
            try:
                job = prepare_job(planned.args, kind=kind, opts=opts, rules=rules)
            except ValidationError as error:
                raise ValidationError(f"workflow {self.name!r}, step {index}: {error}") from None
            extra = orjson.dumps(planned.metadata).decode()
            job.metadata_json = (
                extra if job.metadata_json == "{}" else extra[:-1] + "," + job.metadata_json[1:]
            )
            job.dependency_policy = planned.policy
            prepared.append(job)
        return prepared

    def flow(self, rules: InsertRules) -> Flow[WorkflowRun]:
        """Insert the workflow; run it inside a transaction (or savepoint), which it leaves
        to roll back when it raises.

        A Workflow inserts once: a second insert of the same object (or of a copy, which has
        the same id) raises ValidationError, whether the first committed earlier or is being
        inserted by another transaction now."""
        prepared = self.prepare(rules)
        external = [parent for planned in self._planned for parent in planned.external]
        yield from dependency_preflight_flow(external, self.id, self.name)
        # Depth limits apply as to any insert (a rejected queue refuses the whole workflow).
        queues = [job.queue for job in prepared]
        rows = yield from guarded_flow(rules, insert_flow(prepared), queues)
        for planned, job in zip(self._planned, prepared, strict=True):
            parents = [rows[index].id for index in planned.steps] + list(planned.external)
            job.depends_on = tuple(dict.fromkeys(parents)) or None
        rows = yield from dependencies_flow(rows, prepared)
        ids = [row.id for row in rows]
        yield Statement(query("set_workflow"), {"workflow": self.id, "ids": ids}, self._alone)
        return WorkflowRun(self.id, self.name, rows)

    def _alone(self, rows: list[dict[str, Any]]) -> None:
        """set_workflow's check: no other transaction committed jobs of this workflow id
        while this one inserted its own (the preflight's lock makes that a narrow race)."""
        if rows and rows[0]["others"]:
            raise ValidationError(
                f"workflow {self.name!r} ({self.id}) was inserted already: a Workflow object "
                "inserts once (build a new one to insert the same steps again)"
            )


def _cycle(parents: list[tuple[int, ...]]) -> list[int] | None:
    """A cycle among steps (``parents[i]``: the steps step i depends on), as the path of
    steps that closes it (``[0, 2, 0]``), or None. Iterative depth-first search."""
    state = [0] * len(parents)  # 0: not seen, 1: on the current path, 2: done
    for root in range(len(parents)):
        if state[root]:
            continue
        path = [root]
        pending = [iter(parents[root])]
        state[root] = 1
        while pending:
            step = next(pending[-1], None)
            if step is None:
                state[path.pop()] = 2
                pending.pop()
            elif state[step] == 1:
                return [*path[path.index(step) :], step]
            elif state[step] == 0:
                state[step] = 1
                path.append(step)
                pending.append(iter(parents[step]))
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowRun:
    """An inserted workflow: its id and its jobs as inserted, in the order of ``add``."""

    id: uuid.UUID
    name: str
    jobs: list[JobRow]

    def __getitem__(self, step: Step) -> JobRow:
        if step.workflow != self.id:
            raise KeyError("a step of another workflow")
        return self.jobs[step.index]


@dataclasses.dataclass(frozen=True, slots=True)
class BatchRun:
    """An inserted batch: its id (a workflow id), its members and its fan-in job."""

    id: uuid.UUID
    members: list[JobRow]
    fan_in: JobRow


def batch_workflow(
    members: Iterable[Any], on_complete: Any, options: Mapping[str, Any]
) -> tuple[Workflow, Step]:
    """The workflow of a batch: each member with ``options`` (an ``EnqueueRequest`` member
    sets its own), and the fan-in job ``on_complete`` after all of them."""
    if isinstance(members, str | bytes | Mapping) or not isinstance(members, Iterable):
        raise ValidationError(
            f"insert_batch() takes a list of members (args), not {type(members).__name__}"
        )
    workflow = Workflow("batch")
    steps = [workflow.add(member, **options) for member in members]
    if not steps:
        raise ValidationError("insert_batch() needs at least one member")
    if not isinstance(on_complete, EnqueueRequest):
        on_complete = EnqueueRequest(on_complete)
    fan_in = workflow.add(on_complete, depends_on=steps, on_dependency_failure="run")
    workflow._mark(fan_in, FAN_IN, True)
    return workflow, fan_in


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowJob:
    """One job of a workflow: its row and the ids of the jobs it depends on."""

    job: JobRow
    depends_on: list[int]


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowInfo:
    """A workflow as stored now: every job with its state and dependencies."""

    id: uuid.UUID
    jobs: list[WorkflowJob]

    @property
    def name(self) -> str | None:
        for entry in self.jobs:
            marker = entry.job.metadata.get(WORKFLOW)
            if isinstance(marker, dict):
                return str(marker.get("name"))
        return None

    def states(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for entry in self.jobs:
            counts[entry.job.state.value] = counts.get(entry.job.state.value, 0) + 1
        return counts


def workflow_id(value: uuid.UUID | str) -> uuid.UUID:
    return uuid_from(
        value,
        lambda type_name: ValidationError(f"a workflow id is a UUID, not a {type_name}"),
        lambda _, shown: ValidationError(f"a workflow id is a UUID, not {shown}"),
    )


def _info(rows: list[dict[str, Any]]) -> list[WorkflowJob]:
    return [WorkflowJob(JobRow.from_record(row), list(row["depends_on"])) for row in rows]


def get_workflow_statement(workflow: uuid.UUID | str) -> Statement[list[WorkflowJob]]:
    return Statement(query("workflow_jobs"), {"workflow": workflow_id(workflow)}, _info)


def cancel_workflow_statement(workflow: uuid.UUID | str) -> Statement[int]:
    def count(rows: list[dict[str, Any]]) -> int:
        return int(rows[0]["count"])

    return Statement(query("cancel_workflow"), {"workflow": workflow_id(workflow)}, count)
