"""Resolving callbacks through AsyncClient: the transition and its follow-ups commit in one
transaction, then the lifecycle hooks run once, in this process.

A follow-up that fails rolls the resolution back with it: the call raises, the job stays
parked with the same callback id, and the sender can try again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import uuid
from typing import Any

import psycopg

from awa import callbacks
from awa.lifecycle.dependents import fire_cancelled_dependents, may_have_cancelled_dependents
from awa.lifecycle.events import Completed, Exhausted, JobEvent, Retried
from awa.lifecycle.followups import FollowUpRegistry, Trigger, TriggerContext, insert_follow_ups
from awa.lifecycle.hooks import HookDispatcher
from awa.model import JobRow
from awa.observability import tracing
from awa.outcomes import CallbackToken
from awa.storage.db import Flow, drive_async

CallbackId = str | uuid.UUID | CallbackToken


@dataclasses.dataclass(frozen=True, slots=True)
class _Effect:
    """What a committed resolution fires: follow-ups for ``context``, then ``event``."""

    row: JobRow
    context: TriggerContext
    event: JobEvent[Any]


def _latest_error(row: JobRow) -> str:
    return str(row.errors[-1].get("error", "")) if row.errors else ""


def _completed(row: JobRow) -> _Effect:
    event = Completed(row, row.args, dt.timedelta(0), row.output)
    return _Effect(row, TriggerContext(Trigger.COMPLETED), event)


def _exhausted(row: JobRow) -> _Effect:
    error = _latest_error(row)
    context = TriggerContext(Trigger.EXHAUSTED, error=error, attempt=row.attempt)
    return _Effect(row, context, Exhausted(row, row.args, error, row.attempt))


class CallbackResolution:
    """Mixin of AsyncClient: callback resolution with follow-ups and hooks."""

    _follow_ups: FollowUpRegistry
    hook_dispatcher: HookDispatcher

    def connection(self) -> contextlib.AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]:
        raise NotImplementedError  # provided by AsyncClient

    async def _resolve(self, flow: Flow[Any], effect_of: Any) -> Any:
        # In the resolver's trace: its follow-ups carry the resolver's context.
        with tracing.child_span("awa.callback.resolve") as span:
            async with self.connection() as conn, conn.transaction():
                result = await drive_async(conn, flow)
                effect: _Effect | None = effect_of(result)
                if effect is not None:
                    if span is not None:
                        span.set_attribute("awa.job.id", effect.row.id)
                        span.set_attribute("awa.job.kind", effect.row.kind)
                    specs = self._follow_ups.specs(effect.context.trigger, effect.row.kind)
                    if specs:
                        rules = self._follow_ups.insert_rules
                        await insert_follow_ups(conn, specs, effect.row, effect.context, rules)
        if effect is not None:
            await self.hook_dispatcher.dispatch_and_wait(effect.event)
            if may_have_cancelled_dependents(effect.row):
                await fire_cancelled_dependents(self.connection, self.hook_dispatcher, effect.row)
        return result

    async def complete_external(
        self, callback_id: CallbackId, payload: Any = None, run_lease: int | None = None
    ) -> JobRow:
        """Complete the job holding this callback (Completed event with zero duration; the
        payload, if any, becomes the job's output). Raises CallbackNotFound when no parked
        or running job holds it (already resolved, replaced, timed out)."""
        flow = callbacks.complete_flow(callback_id, payload, run_lease)
        row: JobRow = await self._resolve(flow, _completed)
        return row

    async def fail_external(
        self, callback_id: CallbackId, error: str, run_lease: int | None = None
    ) -> JobRow:
        """Fail the job holding this callback (Exhausted event)."""
        row: JobRow = await self._resolve(
            callbacks.fail_flow(callback_id, error, run_lease), _exhausted
        )
        return row

    async def retry_external(self, callback_id: CallbackId, run_lease: int | None = None) -> JobRow:
        """Run a parked job again from a fresh attempt budget (Retried event, reporting the
        attempt that parked)."""

        def effect(retried: callbacks.RetriedCallback) -> _Effect:
            row, attempt = retried.job, retried.parked_attempt
            error = _latest_error(row)
            context = TriggerContext(
                Trigger.RETRIED, error=error, attempt=attempt, next_run_at=row.run_at
            )
            return _Effect(row, context, Retried(row, row.args, error, attempt, row.run_at))

        retried: callbacks.RetriedCallback = await self._resolve(
            callbacks.retry_flow(callback_id, run_lease), effect
        )
        return retried.job

    async def resolve_callback(
        self,
        callback_id: CallbackId,
        payload: Any = None,
        default_action: callbacks.DefaultAction = "ignore",
        run_lease: int | None = None,
    ) -> callbacks.ResolveResult:
        """Complete, fail or ignore by the callback's CEL expressions; without expressions,
        do ``default_action``. Completed and Exhausted fire as for the other methods."""

        def effect(result: callbacks.ResolveResult) -> _Effect | None:
            if result.job is None:
                return None
            return _completed(result.job) if result.is_completed() else _exhausted(result.job)

        resolved: callbacks.ResolveResult = await self._resolve(
            callbacks.resolve_flow(callback_id, payload, default_action, run_lease), effect
        )
        return resolved

    async def resume_external(
        self, callback_id: CallbackId, payload: Any = None, run_lease: int | None = None
    ) -> JobRow:
        """Hand ``payload`` to the job: a handler waiting in ``wait_for_callback`` gets it
        back; a job parked by WaitForCallback runs again (Started, then its outcome's event)
        and finds it in ``job.callback_result``. No event of its own."""
        row: JobRow = await self._resolve(
            callbacks.resume_flow(callback_id, payload, run_lease), lambda _: None
        )
        return row

    async def heartbeat_callback(
        self, callback_id: CallbackId, timeout_seconds: float = callbacks.DEFAULT_TIMEOUT
    ) -> JobRow:
        """Push a parked job's callback timeout to ``timeout_seconds`` from now."""
        row: JobRow = await self._resolve(
            callbacks.heartbeat_flow(callback_id, timeout_seconds), lambda _: None
        )
        return row
