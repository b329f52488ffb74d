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
-- Scheduled and retryable jobs whose run_at has passed become available: they move from
-- held_jobs to active_jobs, whose insert trigger tells the workers where in their lanes the
-- promoted jobs sit (run_at is kept, so they keep their place in FIFO order).
WITH due AS (
    SELECT id FROM awa.held_jobs
    WHERE state IN ('scheduled', 'retryable') AND run_at <= now()
    ORDER BY run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), moved AS (
    DELETE FROM awa.held_jobs AS j
    WHERE j.id = ANY(ARRAY(SELECT id FROM due)) AND j.state IN ('scheduled', 'retryable')
    RETURNING j.*
), promoted AS (
    INSERT INTO awa.active_jobs
    SELECT r.* FROM moved AS m
    CROSS JOIN LATERAL awa.as_active(to_jsonb(m) || '{"state": "available"}'::jsonb) AS r
    ORDER BY r.run_at, r.id
    RETURNING queue
)
SELECT count(*) AS promoted, count(DISTINCT queue) AS queues FROM promoted

-- name: promote_due_ids
-- Slow path of promotion after a unique-key collision: the due ids, promoted one by one.
SELECT id FROM awa.held_jobs
WHERE state IN ('scheduled', 'retryable') AND run_at <= now()
ORDER BY run_at, id
LIMIT %(limit)s

-- name: promote_one
WITH moved AS (
    DELETE FROM awa.held_jobs AS j
    WHERE j.id = %(id)s AND j.state IN ('scheduled', 'retryable') AND j.run_at <= now()
    RETURNING j.*
)
INSERT INTO awa.active_jobs
SELECT r.* FROM moved AS m
CROSS JOIN LATERAL awa.as_active(to_jsonb(m) || '{"state": "available"}'::jsonb) AS r
RETURNING queue

-- name: cancel_colliding_pending
-- A due job that cannot become available because a newer job holds its unique key.
UPDATE awa.held_jobs
SET state = 'cancelled', finalized_at = now(),
    errors = errors || jsonb_build_array(jsonb_build_object(
        'error', 'cancelled at promotion: another job holds its unique key',
        'attempt', attempt, 'at', now()))
WHERE id = %(id)s AND state IN ('scheduled', 'retryable')
RETURNING id

-- name: rescue_condition_stale_heartbeat
-- Running attempts whose process stopped heartbeating: presumed dead. The rescue_condition_*
-- fragments are boolean conditions on the rows of a home AS j (active_jobs for running
-- attempts, held_jobs for parked ones), spliced into the rescue statements below as
-- {condition}, with the home as {home}.
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
-- the whole condition once locked, not just against its state. The rescued rows move to
-- held_jobs.
-- With %(announce)s each rescued attempt is announced on awa_cancel (with its run_lease),
-- so that a handler still running it in any process sees job.is_cancelled() (its outcome
-- is stale by now).
WITH locked AS (
    SELECT j.id FROM awa.{home} AS j
    WHERE ({condition})
    ORDER BY j.id
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
), moved AS (
    DELETE FROM awa.{home} AS j
    WHERE j.id = ANY(ARRAY(SELECT id FROM locked))
    RETURNING j.*
), rescued AS (
    INSERT INTO awa.held_jobs
    SELECT r.* FROM moved AS m
    CROSS JOIN LATERAL awa.as_held(to_jsonb(m) || jsonb_build_object(
        'state', CASE WHEN m.attempt >= m.max_attempts THEN 'failed' ELSE 'retryable' END,
        'run_at', CASE WHEN m.attempt >= m.max_attempts THEN m.run_at
                       ELSE now() + awa.retry_delay(m.attempt, 2.0, 0.25, 86400.0) END,
        'finalized_at', now(), 'heartbeat_at', NULL, 'deadline_at', NULL,
        'callback_id', NULL, 'callback_timeout_at', NULL, 'callback_filter', NULL,
        'callback_on_complete', NULL, 'callback_on_fail', NULL, 'callback_transform', NULL,
        'callback_in_handler', false,
        'errors', m.errors || jsonb_build_array(jsonb_build_object(
            'error', %(error)s::text, 'attempt', m.attempt, 'at', now(),
            'rescued', %(reason)s::text))
    )) AS r
    RETURNING *
)
SELECT r.* FROM rescued AS r
LEFT JOIN LATERAL (
    SELECT pg_notify('awa_cancel', json_build_object('job_id', r.id, 'run_lease', r.run_lease)::text)
    WHERE %(announce)s
) AS announced ON true

-- name: rescue_candidate_ids
-- The slow path after a unique-key collision: candidates one by one.
SELECT j.id FROM awa.{home} AS j WHERE ({condition}) ORDER BY j.id LIMIT %(limit)s

-- name: cancel_rescued_duplicate
-- A rescued job whose retry would collide with a newer job holding its unique key: the
-- newer job wins and this one is cancelled, with the reason recorded (and announced as in
-- rescue_jobs).
WITH moved AS (
    DELETE FROM awa.{home} AS j
    WHERE j.id = %(id)s AND ({condition})
    RETURNING j.*
), cancelled AS (
    INSERT INTO awa.held_jobs
    SELECT r.* FROM moved AS m
    CROSS JOIN LATERAL awa.as_held(to_jsonb(m) || jsonb_build_object(
        'state', 'cancelled', 'finalized_at', now(), 'heartbeat_at', NULL, 'deadline_at', NULL,
        'callback_id', NULL, 'callback_timeout_at', NULL, 'callback_filter', NULL,
        'callback_on_complete', NULL, 'callback_on_fail', NULL, 'callback_transform', NULL,
        'callback_in_handler', false,
        'errors', m.errors || jsonb_build_array(jsonb_build_object(
            'error', 'rescued as duplicate: ' || %(error)s::text
                     || ', and a newer job holds its unique key',
            'attempt', m.attempt, 'at', now(), 'rescued', %(reason)s::text))
    )) AS r
    RETURNING *
)
SELECT c.* FROM cancelled AS c
LEFT JOIN LATERAL (
    SELECT pg_notify('awa_cancel', json_build_object('job_id', c.id, 'run_lease', c.run_lease)::text)
    WHERE %(announce)s
) AS announced ON true

-- name: delete_finished
-- Retention by row, in bounded batches, oldest first: failed and cancelled jobs older than
-- their retention, and the completed jobs of queues whose own retention
-- (awa.queue_retention) is shorter than the worker-wide one. Every other completed job leaves
-- with its slot of awa.done_jobs, truncated whole once its retention has passed
-- (done_ring_* below). Deleting a row frees its unique key.
WITH failed AS (
    SELECT j.id FROM awa.held_jobs AS j
    LEFT JOIN awa.queue_retention AS r ON r.queue = j.queue
    WHERE j.state IN ('failed', 'cancelled')
      AND j.finalized_at < now() - make_interval(secs => least(%(failed)s,
              (SELECT min(failed_seconds) FROM awa.queue_retention)))
      AND j.finalized_at < now() - make_interval(secs => coalesce(r.failed_seconds, %(failed)s))
    ORDER BY j.finalized_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
), gone_failed AS (
    DELETE FROM awa.held_jobs AS j WHERE j.id = ANY(ARRAY(SELECT id FROM failed)) RETURNING 1
), completed AS (
    SELECT j.id FROM awa.done_jobs AS j
    JOIN awa.queue_retention AS r ON r.queue = j.queue
    WHERE r.completed_seconds < %(completed)s
      AND j.finalized_at < now() - make_interval(secs => r.completed_seconds)
    ORDER BY j.finalized_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
), gone_completed AS (
    DELETE FROM awa.done_jobs AS j
    WHERE j.id = ANY(ARRAY(SELECT id FROM completed))
    RETURNING 1
)
SELECT (SELECT count(*) FROM gone_failed) + (SELECT count(*) FROM gone_completed) AS deleted

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
-- Dead rows of the job tables that vacuum can reclaim between rotations: the active ring's
-- slots and held_jobs (done_jobs only grows, and leaves by truncation).
SELECT relname AS relation, n_dead_tup AS dead FROM pg_stat_user_tables
WHERE schemaname = 'awa'
  AND (relname = 'held_jobs' OR relname LIKE 'active\_jobs\_%')
ORDER BY n_dead_tup DESC

-- name: vacuum_jobs
-- Run by the leader when dead rows pile up faster than autovacuum's naptime clears them.
-- Never inside a transaction. {relation} is one of the tables above.
VACUUM awa.{relation}

-- name: fold_done_counts
-- The leader folds the count rows of completed jobs (see migration 12).
SELECT awa.fold_done_counts() AS folded

-- name: queue_samples_store
-- The leader's sample of every queue with live jobs or jobs finished in the last hour: live
-- jobs by state (completed and cancelled ones are not counted: their totals are the
-- completion counters'), and the jobs finished in the last hour by state (the operator UI's
-- throughput). Completed jobs are counted by awa.completed_counts (migration 12), from
-- the count rows the completions append; the rows of queues with none of these any more are
-- removed in the same statement. Unserved kinds: those with jobs due for more than a minute
-- that no live worker of the queue runs (awa.unserved_kinds, migration 14).
WITH unserved AS (
    SELECT queue, jsonb_object_agg(kind, available) AS kinds
    FROM awa.unserved_kinds(interval '1 minute')
    GROUP BY queue
), counted AS (
    SELECT queue, state,
           count(*) FILTER (WHERE state <> 'cancelled') AS n,
           count(*) FILTER (WHERE finalized_at > now() - interval '1 hour') AS finished
    FROM awa.jobs
    WHERE state <> 'completed'
      AND (state <> 'cancelled' OR finalized_at > now() - interval '1 hour')
    GROUP BY queue, state
    UNION ALL
    SELECT queue, 'completed', 0, since
    FROM awa.completed_counts(now() - interval '1 hour')
    WHERE since > 0
), oldest AS (
    SELECT queue, min(run_at) AS oldest_available_at FROM awa.jobs
    WHERE state = 'available'
    GROUP BY queue
), sample AS (
    SELECT c.queue,
           COALESCE(jsonb_object_agg(c.state, c.n) FILTER (WHERE c.n > 0), '{}') AS counts,
           COALESCE(jsonb_object_agg(c.state, c.finished) FILTER (WHERE c.finished > 0), '{}')
               AS finished_hour,
           o.oldest_available_at,
           COALESCE(u.kinds, '{}') AS unserved_kinds
    FROM counted AS c LEFT JOIN oldest AS o ON o.queue = c.queue
    LEFT JOIN unserved AS u ON u.queue = c.queue
    GROUP BY c.queue, o.oldest_available_at, u.kinds
), stored AS (
    INSERT INTO awa.queue_samples AS s
        (queue, counts, finished_hour, oldest_available_at, unserved_kinds, sampled_at)
    SELECT queue, counts, finished_hour, oldest_available_at, unserved_kinds, now() FROM sample
    ON CONFLICT (queue) DO UPDATE
    SET counts = EXCLUDED.counts,
        finished_hour = EXCLUDED.finished_hour,
        oldest_available_at = EXCLUDED.oldest_available_at,
        unserved_kinds = EXCLUDED.unserved_kinds,
        sampled_at = EXCLUDED.sampled_at
    RETURNING s.queue
)
DELETE FROM awa.queue_samples AS s
WHERE NOT EXISTS (SELECT 1 FROM stored WHERE stored.queue = s.queue)

-- name: queue_samples
-- What a metrics scrape reports: the last sample of each queue, with its age.
SELECT queue, counts, EXTRACT(EPOCH FROM now() - oldest_available_at)::float8 AS lag,
       EXTRACT(EPOCH FROM now() - sampled_at)::float8 AS sample_age, unserved_kinds
FROM awa.queue_samples
ORDER BY queue
