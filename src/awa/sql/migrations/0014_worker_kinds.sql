-- The job kinds each worker runtime has handlers for. A worker claims only those kinds, so a
-- job of a kind it cannot run waits for a worker that can (a rolling deploy that adds a kind
-- never fails the new kind's jobs on the old workers). Health, the queue gauges and the
-- operator UI report kinds whose jobs wait on a queue while none of its live workers runs
-- them. NULL: a runtime of an earlier release, which claims every kind.
ALTER TABLE awa.runtimes ADD COLUMN kinds text[];

-- The leader's sample of those kinds per queue: {kind: available jobs}, counting jobs due for
-- longer than a minute (see queue_samples_store).
ALTER TABLE awa.queue_samples ADD COLUMN unserved_kinds jsonb NOT NULL DEFAULT '{}';

-- Kinds whose jobs have been due for longer than p_after on a queue that live workers run
-- while none of them has a handler for the kind (a rolling deploy half done, a task missing
-- from a worker): per queue and kind, the jobs and the run_at of the oldest. A queue that no
-- live worker runs is an unserved queue instead (see awa.observability.health); a paused
-- queue's jobs wait anyway.
CREATE FUNCTION awa.unserved_kinds(p_after interval)
RETURNS TABLE (queue text, kind text, available bigint, oldest_run_at timestamptz)
LANGUAGE sql STABLE
AS $$
    WITH live AS (
        SELECT r.queues, r.kinds FROM awa.runtimes AS r
        WHERE r.heartbeat_at + r.stale_after >= now()
    )
    SELECT a.queue, a.kind, count(*), min(a.run_at)
    FROM awa.active_jobs AS a
    WHERE a.state = 'available' AND a.run_at < now() - p_after
      AND EXISTS (SELECT 1 FROM live WHERE a.queue = ANY(live.queues))
      AND NOT EXISTS (SELECT 1 FROM awa.queues AS q WHERE q.queue = a.queue AND q.paused)
      AND NOT EXISTS (
          SELECT 1 FROM live
          WHERE a.queue = ANY(live.queues) AND (live.kinds IS NULL OR a.kind = ANY(live.kinds))
      )
    GROUP BY a.queue, a.kind
$$;
