"""The worker runtime of an AsyncClient: dispatchers, completion, heartbeat, listener and
maintenance, started together and shut down in order."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar, cast

import psycopg

from awa.core.kinds import decoder_for
from awa.core.outage import FailureLog, quiet_pool_reconnect_errors
from awa.core.tasks import cancel_and_wait
from awa.errors import DatabaseError
from awa.job import Job
from awa.lifecycle.events import Started
from awa.lifecycle.followups import (
    FollowUpRegistry,
)
from awa.lifecycle.hooks import HookDispatcher
from awa.observability import metrics
from awa.observability.health import RuntimeHealth
from awa.observability.queue_samples import keep_queue_samples
from awa.producer.insert import InsertRules
from awa.sql import query
from awa.storage.db import Statement, run_async, translate_errors
from awa.worker import limits, results
from awa.worker.attempts import InFlight
from awa.worker.commits import OutcomeCommits
from awa.worker.completer import CLOSE_TIMEOUT, CompletionBatcher
from awa.worker.config import QueueConfig, RuntimeConfig
from awa.worker.dispatcher import QueueDispatcher
from awa.worker.duties import leader_duties
from awa.worker.executor import run_attempt
from awa.worker.finalizer import (
    Finalizer,
)
from awa.worker.follow_up_batch import flush_with_follow_ups, has_follow_ups
from awa.worker.heartbeat import Heartbeat
from awa.worker.lanes import LanePositions
from awa.worker.listener import Listener
from awa.worker.maintenance import (
    Maintenance,
)
from awa.worker.overrides import OverrideWatcher, observed
from awa.worker.presence import Presence
from awa.worker.registry import TaskRegistry
from awa.worker.rescue import Rescue, after_rescue
from awa.worker.results import Outcome
from awa.worker.weighted_pool import WeightedPool


class RuntimeHost(Protocol):
    """What a runtime needs from the client that starts it (``AsyncClient``): its pooled
    connections, its database URL (for the runtime's own connections) and its name."""

    @property
    def application_name(self) -> str: ...

    async def database_url(self) -> str: ...

    def connection(self) -> AbstractAsyncContextManager[psycopg.AsyncConnection[Any]]: ...

    def transaction(self) -> Any:
        """A transaction on the client's pool (``awa.Transaction``), for ``job.finalize()``."""
        ...


log = logging.getLogger("awa.worker")
R = TypeVar("R")

# After the shutdown timeout, handlers see is_cancelled() and get this long to return
# before they are interrupted and their jobs requeued.
CANCEL_GRACE = 1.0


class Runtime(OutcomeCommits):
    _host: RuntimeHost

    def __init__(
        self,
        host: RuntimeHost,
        registry: TaskRegistry,
        queues: list[QueueConfig],
        config: RuntimeConfig,
        *,
        hooks: HookDispatcher,
        follow_ups: FollowUpRegistry,
    ) -> None:
        self._host = host
        self._hooks = hooks
        self._finalizer = Finalizer(follow_ups)
        self._follow_ups = follow_ups
        self.registry = registry
        # The kinds this worker claims: those it has handlers for when it starts. A job of
        # another kind waits on its queue for a worker that runs it (a rolling deploy that
        # adds a kind never fails the new kind's jobs on the old workers).
        self._kinds = sorted(task.kind for task in registry)
        self.config = config
        self.pool: WeightedPool | None = None
        if config.global_max_workers is not None:
            self.pool = WeightedPool(config.global_max_workers, queues)
            # A weighted queue may use its minimum and the whole overflow: that many slots.
            queues = [
                dataclasses.replace(queue, max_workers=self.pool.ceiling(queue.name))
                if queue.weighted
                else queue
                for queue in queues
            ]
        self.queues = queues
        self.inflight = InFlight()
        self._callback_waiters: dict[int, asyncio.Event] = {}
        self._interrupting = asyncio.Event()
        self._hurry = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        # Any queue run here may hold jobs of a def handler (an insert may name any queue), so
        # they may fill every slot; the pool starts threads only as they are needed.
        has_sync = any(not task.is_async for task in registry)
        sync_slots = sum(queue.max_workers for queue in queues) if has_sync else 0
        self.threads = ThreadPoolExecutor(
            max_workers=config.sync_handler_threads or max(1, sync_slots),
            thread_name_prefix="awa-handler",
        )
        self._dispatchers = {
            queue.name: QueueDispatcher(
                queue,
                claim=self._claim,
                execute=self._execute,
                backlogged=self._completions_backlogged,
                pool=self.pool,
            )
            for queue in queues
        }
        if self.pool is not None:
            for name, dispatcher in self._dispatchers.items():
                if name in self.pool:
                    self.pool.on_free(name, dispatcher.room_freed)
        self._completer = CompletionBatcher(
            host.connection,
            flush=functools.partial(flush_with_follow_ups, self._finalizer),
            may_overlap=functools.partial(has_follow_ups, self._finalizer),
            batch_size=config.completion_batch_size,
            linger=config.completion_linger,
            on_done=self._completions_done,
        )
        self._overrides = OverrideWatcher(
            host.connection, queues, self._reconfigure, config.override_refresh_interval
        )
        self._override_task: asyncio.Task[None] | None = None
        self._listener: Listener | None = None
        self._heartbeat: Heartbeat | None = None
        self._maintenance: Maintenance | None = None
        self._presence: Presence | None = None
        self._rescue_tasks: set[asyncio.Task[None]] = set()
        self._sampler: asyncio.Task[None] | None = None
        self._late_commits: set[asyncio.Task[None]] = set()
        self._save_failures = FailureLog(log, "saving outcomes")
        self._application_name = host.application_name
        self.completed = 0
        """Completions committed by this runtime (for progress displays and benchmarks)."""

    # AttemptServices ----------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def insert_rules(self) -> InsertRules:
        return self._follow_ups.insert_rules

    @property
    def follow_ups(self) -> FollowUpRegistry:
        return self._follow_ups

    def transaction(self) -> Any:
        return self._host.transaction()

    async def flush_progress(self, job: Job[Any]) -> None:
        from awa.worker.completer import progress_param

        progress = progress_param(job)
        if progress is None:
            return
        statement = Statement(
            query("flush_progress"),
            {"id": job.id, "lease": job.run_lease, "progress": progress},
            lambda rows: None,
        )
        async with self._host.connection() as conn:
            await run_async(conn, statement)

    async def execute(self, statement: Statement[R]) -> R:
        async with self._host.connection() as conn:
            return await run_async(conn, statement)

    async def wait_signal(self, job_id: int, timeout: float) -> None:
        event = self._callback_waiters.setdefault(job_id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await event.wait()
        event.clear()

    def _wake_callback_waiter(self, job_id: int) -> None:
        # The signal is kept for an attempt of this process even when nobody waits yet (the
        # handler is reading its row between two waits): its next wait returns at once and
        # reads the row again, instead of sleeping through the poll interval. The attempt's
        # end drops it (see _execute).
        if job_id in self.inflight:
            self._callback_waiters.setdefault(job_id, asyncio.Event()).set()

    # Lifecycle ----------------------------------------------------------------------------

    @property
    def listener_connected(self) -> bool:
        return self._listener is not None and self._listener.connected

    @property
    def heartbeat_alive(self) -> bool:
        return self._heartbeat is not None and self._heartbeat.alive

    @property
    def is_leader(self) -> bool:
        return self._maintenance is not None and self._maintenance.is_leader

    async def start(self) -> None:
        url = await self._host.database_url()
        quiet_pool_reconnect_errors("awa")
        self._build_decoders()
        self._completer.start()
        self._listener = Listener(
            url,
            application_name=self._application_name,
            on_jobs=self.wake,
            on_ready=self._ready,
            on_cancel=self._cancel_attempt,
            on_callback=self._wake_callback_waiter,
            on_overrides=self._overrides.notify,
            on_reconnect=self._wake_all,
        )
        await self._listener.start()
        # Overrides stored before this worker started apply from its first claim (a read
        # that fails is retried by the watcher; meanwhile the configured settings hold).
        try:
            await self._overrides.refresh()
        except DatabaseError as error:
            log.warning("could not read the queue overrides yet (%s)", error)
        self._override_task = asyncio.create_task(self._overrides.run(), name="awa-overrides")
        # Registered before the dispatchers start, so that health sees the queues served
        # from the first job on; the heartbeat thread keeps the row fresh.
        self._presence = Presence(
            self.queues,
            self._kinds,
            application_name=self._application_name,
            stale_after=self.config.heartbeat_staleness,
            is_leader=lambda: self.is_leader,
        )
        try:
            await self.execute(self._presence.upsert())
        except DatabaseError as error:
            log.warning("could not register this worker in awa.runtimes yet (%s)", error)
        self._heartbeat = Heartbeat(
            url,
            interval=self.config.heartbeat_interval,
            snapshot=self.inflight.snapshot,
            application_name=self._application_name,
            presence=self._presence,
        )
        self._heartbeat.start()
        self._maintenance = Maintenance(
            url,
            application_name=self._application_name,
            election_interval=self.config.leader_election_interval,
            check_interval=self.config.leader_check_interval,
            duties=leader_duties(self.config, on_rescued=self._rescued),
        )
        self._maintenance.start()
        for dispatcher in self._dispatchers.values():
            dispatcher.start()
        metrics.register_runtime(self)
        self._sampler = asyncio.create_task(
            keep_queue_samples(self._host.connection, self.config.queue_sample_interval),
            name="awa-queue-samples",
        )
        log.info("worker started on queues %s", ", ".join(self._dispatchers))

    def _build_decoders(self) -> None:
        """Build each handler's args decoder now rather than at its first job, which would
        otherwise wait for the schema to be built (tens of milliseconds, more on first use
        of the library). A type that cannot be built yet fails at its job, with the error."""
        for task in self.registry:
            with contextlib.suppress(Exception):
                decoder_for(cast(Any, task.args_type))

    async def _rescued(self, rescued: list[Rescue]) -> None:
        """After a rescue commits, apart from the maintenance loop (so user code cannot
        stall the sweeps), run the Rescued follow-ups and hooks. Handlers still running a
        rescued attempt, here or elsewhere, learn it from the rescue's awa_cancel
        announcement."""
        work = after_rescue(rescued, self._follow_ups, self._hooks, self._host.connection)
        task = asyncio.create_task(work, name="awa-rescued")
        self._rescue_tasks.add(task)
        task.add_done_callback(self._rescue_tasks.discard)

    async def shutdown(self, timeout: float) -> None:
        """Stop claiming, let handlers finish (up to ``timeout``), then signal cancellation,
        and finally interrupt what is left and requeue it. Hooks are not awaited."""
        metrics.unregister_runtime(self)
        if self._sampler is not None:
            self._sampler.cancel()
        await cancel_and_wait(self._override_task)
        unstarted: list[Job[Any]] = []
        for dispatcher in self._dispatchers.values():
            unstarted.extend(await dispatcher.stop_claiming())
        await self._release_unstarted(unstarted)
        busy = await self._drain_slots(timeout)
        if busy:
            self.inflight.cancel_all()
            _, still_busy = await asyncio.wait(busy, timeout=CANCEL_GRACE)
            busy = list(still_busy)
        if busy:
            self._interrupting.set()
            for slot in busy:
                slot.cancel()
            await asyncio.gather(*busy, return_exceptions=True)
        await self._completer.close()
        if self._late_commits:
            # Completions taken out of a batch (their follow-ups failed): a short grace while
            # the database answers; what is left stays running and rescue retries it.
            self._interrupting.set()
            _, unfinished = await asyncio.wait(self._late_commits, timeout=CLOSE_TIMEOUT)
            for task in unfinished:
                task.cancel()
        if self._heartbeat is not None:
            await asyncio.to_thread(self._heartbeat.stop)
        if self._presence is not None:
            # A clean stop leaves no row behind (a crash leaves one that expires).
            try:
                async with asyncio.timeout(CANCEL_GRACE):
                    await self.execute(self._presence.delete())
            except (DatabaseError, TimeoutError) as error:
                log.warning("could not remove this worker from awa.runtimes (%s)", error)
        if self._listener is not None:
            await self._listener.stop()
        if self._maintenance is not None:
            await self._maintenance.stop()
        if self._rescue_tasks:
            # Rescue follow-ups are best-effort: a short grace, then they are dropped.
            _, unfinished = await asyncio.wait(self._rescue_tasks, timeout=CANCEL_GRACE)
            for task in unfinished:
                task.cancel()
        self.threads.shutdown(wait=False, cancel_futures=True)
        log.info("worker stopped")

    def hurry(self) -> None:
        """Cut a shutdown's wait for running handlers short (a second SIGTERM): they are
        cancelled and interrupted now, and their jobs requeued."""
        self._hurry.set()

    async def _drain_slots(self, timeout: float) -> list[asyncio.Task[None]]:
        """Let every queue's busy slots finish; returns those still busy after ``timeout``
        (or at once when ``hurry()`` is called meanwhile)."""
        dispatchers = list(self._dispatchers.values())
        drains = asyncio.ensure_future(
            asyncio.gather(*(dispatcher.drain(timeout) for dispatcher in dispatchers))
        )
        hurried = asyncio.ensure_future(self._hurry.wait())
        waiters: set[asyncio.Future[Any]] = {drains, hurried}
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        hurried.cancel()
        if drains.done():
            results = drains.result()
        else:
            await cancel_and_wait(drains)
            results = await asyncio.gather(*(dispatcher.drain(0) for dispatcher in dispatchers))
        return [slot for pending in results for slot in pending]

    async def _release_unstarted(self, jobs: list[Job[Any]]) -> None:
        if not jobs:
            return
        statement = Statement(
            query("release_unstarted"),
            {"ids": [job.id for job in jobs], "leases": [job.run_lease for job in jobs]},
            lambda rows: None,
        )
        try:
            async with self._host.connection() as conn:
                await run_async(conn, statement)
        except DatabaseError as error:
            log.warning("could not release %d unstarted jobs (%s)", len(jobs), error)
        for job in jobs:
            self.inflight.remove(job)

    # Wakeups and cancellation -------------------------------------------------------------

    def wake(self, queue: str) -> None:
        """Jobs of ``queue`` became available somewhere in its lanes: claim from their heads."""
        dispatcher = self._dispatchers.get(queue)
        if dispatcher is not None:
            dispatcher.lanes.reset()
            dispatcher.wake()

    def _ready(self, queue: str, priority: int, position_us: int, job_id: int) -> None:
        dispatcher = self._dispatchers.get(queue)
        if dispatcher is not None:
            dispatcher.lanes.rewind(priority, position_us, job_id)
            dispatcher.wake()

    def _reconfigure(self, config: QueueConfig) -> None:
        self._dispatchers[config.name].reconfigure(config)

    def _wake_all(self) -> None:
        self._overrides.notify("")  # a change may have been announced while nobody listened
        for dispatcher in self._dispatchers.values():
            dispatcher.lanes.reset()
            dispatcher.wake()

    def _cancel_attempt(self, job_id: int, run_lease: int | None) -> None:
        job = self.inflight.cancel(job_id, run_lease)
        if job is not None:
            log.info(
                "job %s: its running attempt was cancelled or rescued; is_cancelled() is now true",
                job_id,
            )
            self._wake_callback_waiter(job_id)
            grace = self.config.cancel_grace
            if grace is not None and job._handler_task is not None:
                self._loop.call_later(grace, self._interrupt, job, grace)

    def _interrupt(self, job: Job[Any], grace: float) -> None:
        """Interrupt an async handler still running an attempt that was cancelled or rescued
        ``grace`` seconds ago (it ignored is_cancelled()), so that its slot frees up. A plain
        def handler cannot be: its thread would run on with the slot given away."""
        task = job._handler_task
        if task is None or job._interrupt_reason is not None:
            return  # returned meanwhile, or already interrupted
        job._interrupt_reason = (
            "interrupted: the attempt was cancelled or rescued, and its handler had not "
            f"returned {grace:g}s later"
        )
        log.warning("job %s (kind %s): %s", job.id, job.kind, job._interrupt_reason)
        task.cancel()

    # Claim, execute, finalize ------------------------------------------------------------

    async def _claim(
        self, queue: QueueConfig, limit: int, lanes: LanePositions
    ) -> tuple[list[Job[Any]], float | None]:
        with translate_errors():
            async with self._host.connection() as conn:
                claimed = await limits.claim(conn, queue, limit, lanes, self._kinds)
        jobs = [Job.from_claim(row, self) for row in claimed.rows]
        for job in jobs:
            self.inflight.add(job)
        if jobs:
            attributes = {metrics.QUEUE: queue.name}
            metrics.claimed.add(len(jobs), attributes)
            # One measurement per claim (a measurement costs microseconds with an SDK): the
            # wait of its first job, the most urgent one, from due (run_at) to claimed.
            head = claimed.rows[0]
            metrics.head_wait.record(max(head[10] - head[8], 0.0), attributes)
        return jobs, claimed.retry_after

    async def _execute(self, job: Job[Any], queue: QueueConfig) -> None:
        task = self.registry.get(job.kind)
        on_start = None
        if task is not None and self._hooks.wants(job.kind):
            args_type = task.args_type

            # Started goes out as the handler starts (not at claim: a prefetched job may be
            # given back unstarted at shutdown), without waiting for its hooks.
            def on_start() -> None:
                self._hooks.dispatch(Started(job.snapshot(), job._args), args_type)

        outcome = await run_attempt(
            job, task, self.threads, shutting_down=self._interrupting, on_start=on_start
        )
        self._callback_waiters.pop(job.id, None)
        try:
            if job._finalization is not None:
                # The handler wrote its completion in its own transaction.
                await self._settle_own_transaction(job, outcome, queue)
                return
            await self._finalize(job, outcome, queue)
        except Exception:
            # Never let it kill the slot. The row stays running; dropping the attempt from
            # the in-flight set stops its heartbeat, so rescue can recover it.
            log.exception("job %s: finalizing its attempt failed; rescue will retry it", job.id)
            self.inflight.remove(job)

    async def _finalize(self, job: Job[Any], outcome: Outcome, queue: QueueConfig) -> None:
        if isinstance(outcome, results.Completed):
            # Completions are committed in batches, follow-ups and all (follow_up_batch.py).
            # Under a cap the next job waits for this commit: no lingering for company.
            urgent = queue.global_max_running is not None
            if urgent:
                self._dispatchers[job.queue].awaiting_commit()
            self._completer.add(job, outcome.duration, urgent=urgent)
            return
        await self._commit_alone(job, outcome, queue)

    def health(self) -> RuntimeHealth:
        """This runtime's part of a health check."""
        return RuntimeHealth(
            is_leader=self.is_leader,
            listener_connected=self.listener_connected,
            heartbeat_alive=self.heartbeat_alive,
            in_flight=len(self.inflight),
            queues=self.stats(),
        )

    def settings(self) -> dict[str, list[tuple[str, float, bool]]]:
        """Each queue's effective settings, for the ``awa.queue.setting`` gauge."""
        overridden = self._overrides.overridden
        return {
            name: observed(dispatcher.config, overridden.get(name, {}))
            for name, dispatcher in self._dispatchers.items()
        }

    def stats(self) -> dict[str, dict[str, int]]:
        return {
            name: {
                "running": dispatcher.running,
                "buffered": dispatcher.buffered,
                "claimed": dispatcher.claimed,
                "max_workers": dispatcher.config.max_workers,
            }
            for name, dispatcher in self._dispatchers.items()
        }
