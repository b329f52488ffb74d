-- The worker runtime: claim, heartbeat and the outcome of each attempt.
--
-- Every write an attempt makes is guarded by (id, state = 'running', run_lease): a write that
-- matches nothing is stale (the job was rescued, cancelled or re-claimed) and changes nothing.

-- name: claim_jobs
-- The selection must be a CTE: as a FROM-subquery the planner may merge it into the UPDATE
-- and stop honouring the LIMIT. The outer UPDATE re-checks state = 'available' because a row
-- picked here can be claimed by another worker between the pick and the update when the
-- lock is released by a concurrent transaction that changed it.
-- A per-job deadline_duration overrides the queue's; zero means no deadline.
-- The claim commits without waiting for its WAL flush (synchronous_commit off for this
-- statement's transaction only): a claim lost in a server crash leaves the job available,
-- to be claimed again, which at-least-once delivery allows; it saves a disk flush per claim.
WITH durability AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
), picked AS (
    SELECT id FROM awa.jobs, durability
    WHERE state = 'available' AND queue = %(queue)s AND run_at <= now()
      AND NOT EXISTS (
          SELECT 1 FROM awa.queues AS q WHERE q.queue = %(queue)s AND q.paused
      )
    ORDER BY priority, run_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE awa.jobs AS j
SET state = 'running',
    attempt = j.attempt + 1,
    run_lease = j.run_lease + 1,
    attempted_at = now(),
    heartbeat_at = now(),
    deadline_at = CASE
        WHEN COALESCE(j.deadline_duration, %(deadline)s::interval) > interval '0'
        THEN now() + COALESCE(j.deadline_duration, %(deadline)s::interval)
    END
FROM picked
WHERE j.id = picked.id AND j.state = 'available'
-- The returned columns are what awa.Job is built from, in this order: the first sixteen
-- are the handler's, the rest complete the row for lifecycle events (mostly NULL, so nearly
-- free). Timestamps travel as epoch seconds and empty errors/metadata as NULL: both decode
-- several times faster, and the Job converts them back only when asked.
RETURNING j.id, j.kind, j.queue, j.args, j.priority, j.attempt, j.max_attempts, j.run_lease,
          extract(epoch FROM j.run_at)::float8,
          extract(epoch FROM j.created_at)::float8,
          extract(epoch FROM j.attempted_at)::float8,
          extract(epoch FROM j.deadline_at)::float8,
          NULLIF(j.errors, '[]'::jsonb), NULLIF(j.metadata, '{}'::jsonb), j.tags, j.progress,
          j.deadline_duration, j.unique_key, j.unique_states, j.ordering_key, j.callback_id,
          extract(epoch FROM j.callback_timeout_at)::float8, j.callback_filter,
          j.callback_on_complete, j.callback_on_fail, j.callback_transform, j.concurrency_key

-- name: claim_one
-- awa.testing's claim: the first due job of the given kinds (and queue, when given), with
-- the same changes and the same returned columns as claim_jobs (a test holds them equal).
WITH picked AS (
    SELECT id FROM awa.jobs AS c
    WHERE state = 'available' AND run_at <= now() AND kind = ANY(%(kinds)s::text[])
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND NOT EXISTS (SELECT 1 FROM awa.queues AS q WHERE q.queue = c.queue AND q.paused)
    ORDER BY priority, run_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE awa.jobs AS j
SET state = 'running',
    attempt = j.attempt + 1,
    run_lease = j.run_lease + 1,
    attempted_at = now(),
    heartbeat_at = now(),
    deadline_at = CASE
        WHEN COALESCE(j.deadline_duration, %(deadline)s::interval) > interval '0'
        THEN now() + COALESCE(j.deadline_duration, %(deadline)s::interval)
    END
FROM picked
WHERE j.id = picked.id AND j.state = 'available'
RETURNING j.id, j.kind, j.queue, j.args, j.priority, j.attempt, j.max_attempts, j.run_lease,
          extract(epoch FROM j.run_at)::float8,
          extract(epoch FROM j.created_at)::float8,
          extract(epoch FROM j.attempted_at)::float8,
          extract(epoch FROM j.deadline_at)::float8,
          NULLIF(j.errors, '[]'::jsonb), NULLIF(j.metadata, '{}'::jsonb), j.tags, j.progress,
          j.deadline_duration, j.unique_key, j.unique_states, j.ordering_key, j.callback_id,
          extract(epoch FROM j.callback_timeout_at)::float8, j.callback_filter,
          j.callback_on_complete, j.callback_on_fail, j.callback_transform, j.concurrency_key

-- name: release_unstarted
-- Claimed jobs that never reached a handler (shutdown) go back to available, giving back the
-- attempt the claim took. Their queues are notified so other workers take them at once.
WITH released AS (
    UPDATE awa.jobs AS j
    SET state = 'available', attempt = j.attempt - 1, attempted_at = NULL, heartbeat_at = NULL,
        deadline_at = NULL
    FROM unnest(%(ids)s::bigint[], %(leases)s::bigint[]) AS t(id, run_lease)
    WHERE j.id = t.id AND j.run_lease = t.run_lease AND j.state = 'running'
    RETURNING j.id, j.queue
), notified AS (
    SELECT queue, pg_notify('awa_jobs', queue) FROM (SELECT DISTINCT queue FROM released) AS q
)
SELECT (SELECT count(*) FROM released) AS released, (SELECT count(*) FROM notified) AS queues

-- name: complete_batch
-- Completes many attempts in one statement. Rows are locked in id order, the same order the
-- heartbeat uses, so the two cannot deadlock. Returns the attempts that were applied; the
-- others were stale. outputs is NULL (no job of the batch recorded one) or one JSON value
-- per id, NULL for the jobs without output.
WITH attempts AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(leases)s::bigint[], %(outputs)s::jsonb[])
        AS t(id, run_lease, output)
), locked AS (
    SELECT j.id, a.output FROM awa.jobs AS j
    JOIN attempts AS a ON a.id = j.id AND a.run_lease = j.run_lease
    WHERE j.state = 'running'
    ORDER BY j.id
    FOR UPDATE OF j
)
UPDATE awa.jobs AS j
SET state = 'completed', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
    progress = NULL, output = locked.output
FROM locked
WHERE j.id = locked.id
RETURNING j.id, j.run_lease, extract(epoch FROM j.finalized_at)::float8 AS finalized_at

-- name: complete_batch_rows
-- complete_batch for attempts whose follow-ups are inserted in the same transaction. The
-- follow-up closures receive the committed rows: the caller builds them from the claimed
-- rows, so only what may have changed since the claim comes back (metadata, and the
-- callback columns a handler's register_callback wrote), besides the commit time.
WITH attempts AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(leases)s::bigint[], %(outputs)s::jsonb[])
        AS t(id, run_lease, output)
), locked AS (
    SELECT j.id, a.output FROM awa.jobs AS j
    JOIN attempts AS a ON a.id = j.id AND a.run_lease = j.run_lease
    WHERE j.state = 'running'
    ORDER BY j.id
    FOR UPDATE OF j
)
UPDATE awa.jobs AS j
SET state = 'completed', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
    progress = NULL, output = locked.output
FROM locked
WHERE j.id = locked.id
RETURNING j.id, j.finalized_at, j.metadata, j.callback_id, j.callback_timeout_at,
    j.callback_filter, j.callback_on_complete, j.callback_on_fail, j.callback_transform,
    j.callback_in_handler

-- name: savepoint_follow_ups
SAVEPOINT awa_follow_ups

-- name: rollback_to_follow_ups
ROLLBACK TO SAVEPOINT awa_follow_ups

-- name: complete_job
-- output is what the handler recorded (NULL: none).
UPDATE awa.jobs
SET state = 'completed', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
    progress = NULL, output = %(output)s::jsonb
WHERE id = %(id)s AND state = 'running' AND run_lease = %(lease)s
RETURNING *

-- name: retry_job_attempt
-- A failed attempt (an exception, or RetryAfter): retryable with a delay while attempts
-- remain, failed on the last one. An error entry is appended when one is given
-- (RetryAfter with attempts left records none). delay_seconds NULL means exponential backoff.
UPDATE awa.jobs
SET state = CASE WHEN attempt >= max_attempts THEN 'failed' ELSE 'retryable' END::awa.job_state,
    run_at = CASE WHEN attempt >= max_attempts THEN run_at
                  WHEN %(delay_seconds)s::double precision IS NULL
                  THEN now() + awa.retry_delay(attempt, %(base)s, %(jitter)s, %(max_delay)s)
                  ELSE now() + make_interval(secs => %(delay_seconds)s::double precision) END,
    finalized_at = now(),
    heartbeat_at = NULL,
    deadline_at = NULL,
    progress = COALESCE(%(progress)s::jsonb, progress),
    errors = CASE
        WHEN attempt >= max_attempts THEN errors || jsonb_build_array(jsonb_build_object(
            'error', COALESCE(%(error)s::text, %(exhausted_error)s::text),
            'attempt', attempt, 'at', now()))
        WHEN %(error)s::text IS NULL THEN errors
        ELSE errors || jsonb_build_array(jsonb_build_object(
            'error', %(error)s::text, 'attempt', attempt, 'at', now()))
    END
WHERE id = %(id)s AND state = 'running' AND run_lease = %(lease)s
RETURNING *

-- name: fail_job_attempt
-- A terminal failure: failed now whatever the attempts left.
UPDATE awa.jobs
SET state = 'failed', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
    progress = COALESCE(%(progress)s::jsonb, progress),
    errors = errors || jsonb_build_array(jsonb_build_object(
        'error', %(error)s::text, 'attempt', attempt, 'at', now(), 'terminal', true))
WHERE id = %(id)s AND state = 'running' AND run_lease = %(lease)s
RETURNING *

-- name: cancel_job_attempt
UPDATE awa.jobs
SET state = 'cancelled', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
    progress = COALESCE(%(progress)s::jsonb, progress),
    errors = errors || jsonb_build_array(jsonb_build_object(
        'error', 'cancelled: ' || %(reason)s::text, 'attempt', attempt, 'at', now()))
WHERE id = %(id)s AND state = 'running' AND run_lease = %(lease)s
RETURNING *

-- name: snooze_job_attempt
-- Snooze gives back the attempt the claim took: it is a reschedule, not a failure.
UPDATE awa.jobs
SET state = 'scheduled', attempt = attempt - 1,
    run_at = now() + make_interval(secs => %(delay_seconds)s::double precision),
    heartbeat_at = NULL, deadline_at = NULL,
    progress = COALESCE(%(progress)s::jsonb, progress)
WHERE id = %(id)s AND state = 'running' AND run_lease = %(lease)s
RETURNING *

-- name: requeue_interrupted
-- An attempt cut short by worker shutdown goes back to available without consuming the
-- attempt; the interruption is recorded in the error history. The queue is notified so
-- other workers take the job at once.
WITH requeued AS (
    UPDATE awa.jobs
    SET state = 'available', attempt = attempt - 1, run_at = now(), heartbeat_at = NULL,
        deadline_at = NULL, attempted_at = NULL,
        progress = COALESCE(%(progress)s::jsonb, progress),
        errors = errors || jsonb_build_array(jsonb_build_object(
            'error', %(error)s::text, 'attempt', attempt, 'at', now()))
    WHERE id = %(id)s AND state = 'running' AND run_lease = %(lease)s
    RETURNING *
)
SELECT r.* FROM requeued AS r
CROSS JOIN LATERAL (SELECT pg_notify('awa_jobs', r.queue)) AS n

-- name: cancel_duplicate_attempt
-- Fallback when an outcome would move a job back into its unique mask while a newer job
-- holds the key: the newer job wins and this one is cancelled, with the reason recorded.
UPDATE awa.jobs
SET state = 'cancelled', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
    errors = errors || jsonb_build_array(jsonb_build_object(
        'error', %(error)s::text, 'attempt', attempt, 'at', now()))
WHERE id = %(id)s AND state = 'running' AND run_lease = %(lease)s
RETURNING *

-- name: heartbeat
-- Refreshes heartbeat_at of this process's running attempts (and stores progress that
-- changed). Rows are locked in id order, like complete_batch, to avoid deadlocks. A beat
-- lost in a server crash costs nothing, so it does not wait for its WAL flush.
WITH durability AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
), beats AS (
    SELECT t.* FROM durability, unnest(
        %(ids)s::bigint[], %(leases)s::bigint[], %(progress)s::jsonb[]
    ) AS t(id, run_lease, progress)
), locked AS (
    SELECT j.id, b.progress FROM awa.jobs AS j
    JOIN beats AS b ON b.id = j.id AND b.run_lease = j.run_lease
    WHERE j.state = 'running'
    ORDER BY j.id
    FOR UPDATE OF j
)
UPDATE awa.jobs AS j
SET heartbeat_at = now(), progress = COALESCE(locked.progress, j.progress)
FROM locked
WHERE j.id = locked.id
RETURNING j.id

-- name: flush_progress
UPDATE awa.jobs SET progress = %(progress)s::jsonb
WHERE id = %(id)s AND state = 'running' AND run_lease = %(lease)s
RETURNING id

-- name: listen_channels
LISTEN awa_jobs;
LISTEN awa_cancel;
LISTEN awa_callbacks
