"""The maintenance leader's duties, as a runtime's settings configure them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from awa.batch.duty import batch_operation_duty
from awa.core.duty import Duty
from awa.descriptors.duty import descriptor_duty
from awa.dlq.duty import dlq_retention_duty
from awa.lifecycle.events import RescueReason
from awa.overrides.duty import override_log_duty
from awa.periodic.duty import periodic_duty
from awa.worker import limits
from awa.worker.config import RuntimeConfig
from awa.worker.maintenance import promotion_duty, runtime_expiry_duty, vacuum_duty
from awa.worker.queue_sampling import queue_sampling_duty
from awa.worker.rescue import SWEEPS, Rescue, rescue_duty, retention_duty
from awa.worker.storage_ring import active_ring_duty


def leader_duties(
    config: RuntimeConfig, *, on_rescued: Callable[[list[Rescue]], Awaitable[None]]
) -> list[Duty]:
    """Promotion, the three rescue sweeps, retention (of jobs and of DLQ entries), the
    active ring's rotation, stale runtimes, periodic jobs, queue samples, descriptors, batch
    operations, the override log's retention, priority aging and vacuum (the last three
    unless turned off)."""
    intervals = {
        RescueReason.STALE_HEARTBEAT: config.heartbeat_rescue_interval,
        RescueReason.DEADLINE_EXCEEDED: config.deadline_rescue_interval,
        RescueReason.EXPIRED_CALLBACK: config.callback_rescue_interval,
    }
    duties = [
        promotion_duty(config.promote_interval, config.promote_batch_size),
        *(
            rescue_duty(
                SWEEPS[reason],
                interval=interval,
                staleness=config.heartbeat_staleness,
                limit=config.rescue_batch_size,
                on_rescued=on_rescued,
            )
            for reason, interval in intervals.items()
        ),
        retention_duty(
            interval=config.cleanup_interval,
            completed=config.completed_retention,
            failed=config.failed_retention,
            batch_size=config.cleanup_batch_size,
        ),
        dlq_retention_duty(
            interval=config.cleanup_interval,
            retention=config.dlq_retention,
            batch_size=config.cleanup_batch_size,
        ),
        active_ring_duty(config.ring_rotation_interval),
        runtime_expiry_duty(config.cleanup_interval),
        periodic_duty(config.cron_interval),
        queue_sampling_duty(config.queue_sample_interval),
        descriptor_duty(config.descriptor_retention, config.cleanup_interval),
        batch_operation_duty(),
    ]
    override_log = override_log_duty(
        interval=config.cleanup_interval,
        retention=config.override_log_retention,
        batch_size=config.cleanup_batch_size,
    )
    if override_log is not None:
        duties.append(override_log)
    if config.priority_aging_interval > 0:
        duties.append(limits.aging_duty(config.priority_aging_interval))
    if config.vacuum_interval > 0:
        duties.append(vacuum_duty(config.vacuum_interval, config.vacuum_threshold))
    return duties
