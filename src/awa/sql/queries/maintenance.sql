-- Maintenance, run by the one elected leader per database.

-- name: leader_try_lock
-- Session-level advisory lock held on the leader's dedicated connection: it is released
-- when that connection closes, so a dead leader frees the role. Key: ASCII "AWA_MAIN".
SELECT pg_try_advisory_lock(4708303813012965710) AS acquired

-- name: leader_unlock
SELECT pg_advisory_unlock(4708303813012965710) AS released

-- name: leader_check
SELECT 1 AS alive

-- name: promote_due
-- Scheduled and retryable jobs whose run_at has passed become available (run_at is kept, so
-- they keep their place in FIFO order). One notification per queue wakes its workers.
WITH due AS (
    SELECT id FROM awa.jobs
    WHERE state IN ('scheduled', 'retryable') AND run_at <= now()
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), promoted AS (
    UPDATE awa.jobs AS j SET state = 'available'
    FROM due
    WHERE j.id = due.id
    RETURNING j.queue
), notified AS (
    SELECT queue, pg_notify('awa_jobs', queue) FROM (SELECT DISTINCT queue FROM promoted) AS q
)
SELECT (SELECT count(*) FROM promoted) AS promoted, (SELECT count(*) FROM notified) AS queues

-- name: promote_due_ids
-- Slow path of promotion after a unique-key collision: the due ids, promoted one by one.
SELECT id FROM awa.jobs
WHERE state IN ('scheduled', 'retryable') AND run_at <= now()
ORDER BY run_at, id
LIMIT %(limit)s

-- name: promote_one
WITH promoted AS (
    UPDATE awa.jobs SET state = 'available'
    WHERE id = %(id)s AND state IN ('scheduled', 'retryable') AND run_at <= now()
    RETURNING queue
)
SELECT p.queue FROM promoted AS p CROSS JOIN LATERAL (SELECT pg_notify('awa_jobs', p.queue)) AS n

-- name: cancel_colliding_pending
-- A due job that cannot become available because a newer job holds its unique key.
UPDATE awa.jobs
SET state = 'cancelled', finalized_at = now(),
    errors = errors || jsonb_build_array(jsonb_build_object(
        'error', 'cancelled at promotion: another job holds its unique key',
        'attempt', attempt, 'at', now()))
WHERE id = %(id)s AND state IN ('scheduled', 'retryable')
RETURNING id

-- name: rescue_condition_stale_heartbeat
-- Running attempts whose process stopped heartbeating: presumed dead. The rescue_condition_*
-- fragments are boolean conditions on awa.jobs AS j, spliced into the rescue statements
-- below as {condition}.
j.state = 'running' AND j.heartbeat_at < now() - make_interval(secs => %(staleness)s)

-- name: rescue_condition_deadline_exceeded
j.state = 'running' AND j.deadline_at < now()

-- name: rescue_condition_expired_callback
j.state = 'waiting_external' AND j.callback_timeout_at < now()

-- name: rescue_jobs
-- Rescue counts the attempt: the job retries with backoff while attempts remain and fails
-- on its last one, so a job that always hangs or always kills its worker cannot loop
-- forever. The condition sits on the locking scan itself, so a row that changed after the
-- statement's snapshot (a heartbeat that just landed, a completion) is re-checked against
-- the whole condition once locked, not just against its state.
-- With %(announce)s each rescued attempt is announced on awa_cancel (with its run_lease),
-- so that a handler still running it in any process sees job.is_cancelled() (its outcome
-- is stale by now).
WITH locked AS (
    SELECT j.id FROM awa.jobs AS j
    WHERE ({condition})
    ORDER BY j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
), rescued AS (
    UPDATE awa.jobs AS j
    SET state = (CASE WHEN j.attempt >= j.max_attempts THEN 'failed' ELSE 'retryable' END)
            ::awa.job_state,
        run_at = CASE WHEN j.attempt >= j.max_attempts THEN j.run_at
                      ELSE now() + awa.retry_delay(j.attempt, 2.0, 0.25, 86400.0) END,
        finalized_at = now(),
        heartbeat_at = NULL,
        deadline_at = NULL,
        callback_id = NULL, callback_timeout_at = NULL, callback_filter = NULL,
        callback_on_complete = NULL, callback_on_fail = NULL, callback_transform = NULL,
        callback_in_handler = false,
        errors = j.errors || jsonb_build_array(jsonb_build_object(
            'error', %(error)s::text, 'attempt', j.attempt, 'at', now(), 'rescued', %(reason)s::text))
    FROM locked
    WHERE j.id = locked.id
    RETURNING j.*
)
SELECT r.* FROM rescued AS r
LEFT JOIN LATERAL (
    SELECT pg_notify('awa_cancel', json_build_object('job_id', r.id, 'run_lease', r.run_lease)::text)
    WHERE %(announce)s
) AS announced ON true

-- name: rescue_candidate_ids
-- The slow path after a unique-key collision: candidates one by one.
SELECT j.id FROM awa.jobs AS j WHERE ({condition}) ORDER BY j.id LIMIT %(limit)s

-- name: cancel_rescued_duplicate
-- A rescued job whose retry would collide with a newer job holding its unique key: the
-- newer job wins and this one is cancelled, with the reason recorded (and announced as in
-- rescue_jobs).
WITH cancelled AS (
    UPDATE awa.jobs AS j
    SET state = 'cancelled', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
        callback_id = NULL, callback_timeout_at = NULL, callback_filter = NULL,
        callback_on_complete = NULL, callback_on_fail = NULL, callback_transform = NULL,
        callback_in_handler = false,
        errors = j.errors || jsonb_build_array(jsonb_build_object(
            'error', 'rescued as duplicate: ' || %(error)s::text
                     || ', and a newer job holds its unique key',
            'attempt', j.attempt, 'at', now(), 'rescued', %(reason)s::text))
    WHERE j.id = %(id)s AND ({condition})
    RETURNING j.*
)
SELECT c.* FROM cancelled AS c
LEFT JOIN LATERAL (
    SELECT pg_notify('awa_cancel', json_build_object('job_id', c.id, 'run_lease', c.run_lease)::text)
    WHERE %(announce)s
) AS announced ON true

-- name: delete_finished
-- Retention: finished jobs older than their retention, oldest first, in bounded batches.
-- Deleting a row frees its unique key. A queue's own retention (awa.queue_retention)
-- overrides the worker-wide one. The first finalized_at condition (the shortest retention
-- of all) is a range on jobs_finalized_idx, so a batch reads about as many index entries as
-- it deletes; without it the OR of the cutoffs made every batch read and sort every finished
-- row of the table.
WITH shortest AS (
    SELECT least(%(completed)s, %(failed)s,
                 (SELECT min(least(completed_seconds, failed_seconds))
                  FROM awa.queue_retention)) AS seconds
), doomed AS (
    SELECT j.id FROM awa.jobs AS j
    LEFT JOIN awa.queue_retention AS r ON r.queue = j.queue
    WHERE j.state IN ('completed', 'failed', 'cancelled')
      AND j.finalized_at < now() - make_interval(secs => (SELECT seconds FROM shortest))
      AND j.finalized_at < now() - make_interval(secs => CASE WHEN j.state = 'completed'
                                   THEN coalesce(r.completed_seconds, %(completed)s)
                                   ELSE coalesce(r.failed_seconds, %(failed)s) END)
    ORDER BY j.finalized_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
), deleted AS (
    DELETE FROM awa.jobs AS j USING doomed WHERE j.id = doomed.id RETURNING 1
)
SELECT count(*) AS deleted FROM deleted

-- name: queue_retention_store
INSERT INTO awa.queue_retention AS r (queue, completed_seconds, failed_seconds)
VALUES (%(queue)s, %(completed)s, %(failed)s)
ON CONFLICT (queue) DO UPDATE
SET completed_seconds = EXCLUDED.completed_seconds,
    failed_seconds = EXCLUDED.failed_seconds,
    updated_at = now()

-- name: queue_retention_clear
DELETE FROM awa.queue_retention WHERE queue = %(queue)s

-- name: leader_holder
-- Which backend holds the maintenance lock (the key split into its two 32-bit halves).
SELECT a.pid, a.application_name, a.client_addr::text AS client_addr, a.backend_start
FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid)
WHERE l.locktype = 'advisory' AND l.granted
  AND l.classid = (4708303813012965710 >> 32)::oid
  AND l.objid = (4708303813012965710 & 4294967295)::oid
  AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())

-- name: jobs_dead_tuples
SELECT n_dead_tup AS dead FROM pg_stat_user_tables WHERE relid = 'awa.jobs'::regclass

-- name: vacuum_jobs
-- Run by the leader when dead rows pile up faster than autovacuum's naptime clears them
-- (each job leaves about three: claim, completion, retention). Never inside a transaction.
VACUUM awa.jobs

-- name: queue_samples_store
-- The leader's sample of every queue with live jobs or jobs finished in the last hour: live
-- jobs by state (completed and cancelled ones are not counted: their totals are the
-- completion counters'), and the jobs finished in the last hour by state (the operator UI's
-- throughput). One pass over the table; the rows of queues with neither any more are
-- removed in the same statement.
WITH counted AS (
    SELECT queue, state,
           count(*) FILTER (WHERE state NOT IN ('completed', 'cancelled')) AS n,
           count(*) FILTER (WHERE finalized_at > now() - interval '1 hour') AS finished
    FROM awa.jobs
    WHERE state NOT IN ('completed', 'cancelled') OR finalized_at > now() - interval '1 hour'
    GROUP BY queue, state
), oldest AS (
    SELECT queue, min(run_at) AS oldest_available_at FROM awa.jobs
    WHERE state = 'available'
    GROUP BY queue
), sample AS (
    SELECT c.queue,
           COALESCE(jsonb_object_agg(c.state, c.n) FILTER (WHERE c.n > 0), '{}') AS counts,
           COALESCE(jsonb_object_agg(c.state, c.finished) FILTER (WHERE c.finished > 0), '{}')
               AS finished_hour,
           o.oldest_available_at
    FROM counted AS c LEFT JOIN oldest AS o ON o.queue = c.queue
    GROUP BY c.queue, o.oldest_available_at
), stored AS (
    INSERT INTO awa.queue_samples AS s
        (queue, counts, finished_hour, oldest_available_at, sampled_at)
    SELECT queue, counts, finished_hour, oldest_available_at, now() FROM sample
    ON CONFLICT (queue) DO UPDATE
    SET counts = EXCLUDED.counts,
        finished_hour = EXCLUDED.finished_hour,
        oldest_available_at = EXCLUDED.oldest_available_at,
        sampled_at = EXCLUDED.sampled_at
    RETURNING s.queue
)
DELETE FROM awa.queue_samples AS s
WHERE NOT EXISTS (SELECT 1 FROM stored WHERE stored.queue = s.queue)

-- name: queue_samples
-- What a metrics scrape reports: the last sample of each queue, with its age.
SELECT queue, counts, EXTRACT(EPOCH FROM now() - oldest_available_at)::float8 AS lag,
       EXTRACT(EPOCH FROM now() - sampled_at)::float8 AS sample_age
FROM awa.queue_samples
ORDER BY queue
