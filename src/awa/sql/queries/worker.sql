-- The worker runtime: claim, heartbeat and the outcome of each attempt.
--
-- Every write an attempt makes is guarded by (id, state = 'running', run_lease): a write that
-- matches nothing is stale (the job was rescued, cancelled or re-claimed) and changes nothing.

-- name: claim_jobs
-- The claim. The lanes placeholder below takes the UNION ALL of one claim_lane per
-- priority lane of the queue that may hold jobs (most urgent first; see worker/lanes.py): each reads its lane from where this
-- dispatcher's last claim stopped, so a claim never walks the dead entries that earlier
-- claims left behind it, however long a snapshot keeps them. Picked rows are locked as they
-- are read (the LIMIT stops the reading), then updated by id: an index lookup in the slots
-- that hold them, with the state compared as text so that no plan scans a partial index by
-- state (which under a pinned horizon would walk every dead entry of it).
-- The cap is the queue's claim_batch_size, which no claim's limit exceeds. It is there for
-- the planner: a LIMIT given as a parameter is estimated as a tenth of the rows below it,
-- and with the tables' statistics that made the prepared statement's generic plan look far
-- costlier than the custom one, so the server planned every claim again (on the
-- partitioned table, about a quarter of the claim's time) for the very same plan.
-- The claim commits without waiting for its WAL flush: a claim lost in a server crash
-- leaves the job available, to be claimed again, which at-least-once delivery allows.
-- The returned columns are what awa.Job is built from, in this order: the first sixteen
-- are the handler's, the rest complete the row for lifecycle events (mostly NULL, so nearly
-- free). Timestamps travel as epoch seconds and empty errors/metadata as NULL: both decode
-- several times faster, and the Job converts them back only when asked.
WITH durability AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
), picked AS MATERIALIZED (
    SELECT c.id FROM (SELECT u.id FROM ({lanes}) AS u LIMIT {cap}) AS c, durability
    WHERE NOT EXISTS (SELECT 1 FROM awa.queues AS q WHERE q.queue = %(queue)s AND q.paused)
    LIMIT %(limit)s
)
UPDATE awa.active_jobs AS j
SET state = 'running',
    attempt = j.attempt + 1,
    run_lease = j.run_lease + 1,
    attempted_at = now(),
    heartbeat_at = now(),
    deadline_at = CASE
        WHEN COALESCE(j.deadline_duration, %(deadline)s::interval) > interval '0'
        THEN now() + COALESCE(j.deadline_duration, %(deadline)s::interval)
    END
WHERE j.id = ANY(ARRAY(SELECT id FROM picked)) AND j.state::text = 'available'
RETURNING j.id, j.kind, j.queue, j.args, j.priority, j.attempt, j.max_attempts, j.run_lease,
          date_part('epoch', j.run_at),
          date_part('epoch', j.created_at),
          date_part('epoch', j.attempted_at),
          date_part('epoch', j.deadline_at),
          NULLIF(j.errors, '[]'::jsonb), NULLIF(j.metadata, '{{}}'::jsonb), j.tags, j.progress,
          j.deadline_duration, j.unique_key, j.unique_states, j.ordering_key, j.callback_id,
          date_part('epoch', j.callback_timeout_at), j.callback_filter,
          j.callback_on_complete, j.callback_on_fail, j.callback_transform, j.concurrency_key

-- name: claim_lane
-- One lane of claim_jobs: its priority, from a position (run_at, id) on, the kinds this
-- worker has handlers for only. Passing a job of another kind leaves it to a worker that runs
-- it (a rolling deploy that adds a kind); the lane's position may move past it, since this
-- worker never takes it.
SELECT l.id FROM (
    SELECT a.id FROM awa.active_jobs AS a
    WHERE a.state = 'available' AND a.queue = %(queue)s AND a.priority = {priority}
      AND a.run_at <= now() AND (a.run_at, a.id) >= ({after_at}, {after_id})
      AND a.kind = ANY(%(kinds)s::text[])
    ORDER BY a.run_at, a.id
    FOR UPDATE SKIP LOCKED
) AS l

-- name: claim_one
-- awa.testing's claim: the first due job of the given kinds (and queue, when given), with
-- the same changes and the same returned columns as claim_jobs (a test holds them equal).
WITH picked AS (
    SELECT id, slot FROM awa.active_jobs AS c
    WHERE state = 'available' AND run_at <= now() AND kind = ANY(%(kinds)s::text[])
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND NOT EXISTS (SELECT 1 FROM awa.queues AS q WHERE q.queue = c.queue AND q.paused)
    ORDER BY priority, run_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE awa.active_jobs AS j
SET state = 'running',
    attempt = j.attempt + 1,
    run_lease = j.run_lease + 1,
    attempted_at = now(),
    heartbeat_at = now(),
    deadline_at = CASE
        WHEN COALESCE(j.deadline_duration, %(deadline)s::interval) > interval '0'
        THEN now() + COALESCE(j.deadline_duration, %(deadline)s::interval)
    END
WHERE j.id = ANY(ARRAY(SELECT id FROM picked)) AND j.state::text = 'available'
RETURNING j.id, j.kind, j.queue, j.args, j.priority, j.attempt, j.max_attempts, j.run_lease,
          date_part('epoch', j.run_at),
          date_part('epoch', j.created_at),
          date_part('epoch', j.attempted_at),
          date_part('epoch', j.deadline_at),
          NULLIF(j.errors, '[]'::jsonb), NULLIF(j.metadata, '{}'::jsonb), j.tags, j.progress,
          j.deadline_duration, j.unique_key, j.unique_states, j.ordering_key, j.callback_id,
          date_part('epoch', j.callback_timeout_at), j.callback_filter,
          j.callback_on_complete, j.callback_on_fail, j.callback_transform, j.concurrency_key

-- name: release_unstarted
-- Claimed jobs that never reached a handler (shutdown) go back to available, giving back the
-- attempt the claim took. Their queues are notified so other workers take them at once.
WITH released AS (
    UPDATE awa.active_jobs AS j
    SET state = 'available', attempt = j.attempt - 1, attempted_at = NULL, heartbeat_at = NULL,
        deadline_at = NULL
    FROM unnest(%(ids)s::bigint[], %(leases)s::bigint[]) AS t(id, run_lease)
    WHERE j.id = t.id AND j.run_lease = t.run_lease AND j.state::text = 'running'
      AND j.id = ANY(%(ids)s::bigint[])
    RETURNING j.id, j.queue
), notified AS (
    SELECT queue, pg_notify('awa_jobs', queue) FROM (SELECT DISTINCT queue FROM released) AS q
)
SELECT (SELECT count(*) FROM released) AS released, (SELECT count(*) FROM notified) AS queues

-- name: complete_batch
-- Completes many attempts in one statement: each running row moves from active_jobs to
-- done_jobs (the heartbeat skips the rows it holds, so the two cannot deadlock). Returns the
-- attempts that were applied; the others were stale. outputs is
-- NULL (no job of the batch recorded one) or one JSON value per id, NULL for the jobs
-- without output. The rows are found by id (an index lookup, whatever the statistics: the
-- state is compared as text so that no plan scans the partial index of running jobs,
-- which under a pinned horizon holds every dead entry since the pin).
WITH moved AS (
    DELETE FROM awa.active_jobs AS j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state::text = 'running'
      AND j.run_lease = (%(leases)s::bigint[])[array_position(%(ids)s::bigint[], j.id)]
    RETURNING j.*
)
INSERT INTO awa.done_jobs (
    id, kind, queue, args, state, priority, attempt, max_attempts, run_lease, run_at,
    created_at, attempted_at, finalized_at, heartbeat_at, deadline_at, deadline_duration,
    errors, metadata, tags, unique_key, unique_states, ordering_key, callback_id,
    callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail,
    callback_transform, callback_in_handler, progress, output, concurrency_key, workflow_id,
    has_dependents, watched, slot
)
SELECT m.id, m.kind, m.queue, m.args, 'completed', m.priority, m.attempt, m.max_attempts,
    m.run_lease, m.run_at, m.created_at, m.attempted_at, now(), NULL, NULL,
    m.deadline_duration, m.errors, m.metadata, m.tags, m.unique_key, m.unique_states,
    m.ordering_key, m.callback_id, m.callback_timeout_at, m.callback_filter,
    m.callback_on_complete, m.callback_on_fail, m.callback_transform, m.callback_in_handler,
    NULL, (%(outputs)s::jsonb[])[array_position(%(ids)s::bigint[], m.id)], m.concurrency_key,
    m.workflow_id, m.has_dependents, m.watched, (SELECT awa.done_slot())
FROM moved AS m
RETURNING id, run_lease, date_part('epoch', finalized_at) AS finalized_at

-- name: complete_batch_rows
-- complete_batch for attempts whose follow-ups are inserted in the same transaction. The
-- follow-up closures receive the committed rows: the caller builds them from the claimed
-- rows, so only what may have changed since the claim comes back (metadata, and the
-- callback columns a handler's register_callback wrote), besides the commit time.
WITH moved AS (
    DELETE FROM awa.active_jobs AS j
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state::text = 'running'
      AND j.run_lease = (%(leases)s::bigint[])[array_position(%(ids)s::bigint[], j.id)]
    RETURNING j.*
)
INSERT INTO awa.done_jobs (
    id, kind, queue, args, state, priority, attempt, max_attempts, run_lease, run_at,
    created_at, attempted_at, finalized_at, heartbeat_at, deadline_at, deadline_duration,
    errors, metadata, tags, unique_key, unique_states, ordering_key, callback_id,
    callback_timeout_at, callback_filter, callback_on_complete, callback_on_fail,
    callback_transform, callback_in_handler, progress, output, concurrency_key, workflow_id,
    has_dependents, watched, slot
)
SELECT m.id, m.kind, m.queue, m.args, 'completed', m.priority, m.attempt, m.max_attempts,
    m.run_lease, m.run_at, m.created_at, m.attempted_at, now(), NULL, NULL,
    m.deadline_duration, m.errors, m.metadata, m.tags, m.unique_key, m.unique_states,
    m.ordering_key, m.callback_id, m.callback_timeout_at, m.callback_filter,
    m.callback_on_complete, m.callback_on_fail, m.callback_transform, m.callback_in_handler,
    NULL, (%(outputs)s::jsonb[])[array_position(%(ids)s::bigint[], m.id)], m.concurrency_key,
    m.workflow_id, m.has_dependents, m.watched, (SELECT awa.done_slot())
FROM moved AS m
RETURNING id, finalized_at, metadata, callback_id, callback_timeout_at, callback_filter,
    callback_on_complete, callback_on_fail, callback_transform, callback_in_handler

-- name: savepoint_follow_ups
SAVEPOINT awa_follow_ups

-- name: rollback_to_follow_ups
ROLLBACK TO SAVEPOINT awa_follow_ups

-- name: complete_job
-- output is what the handler recorded (NULL: none).
WITH moved AS (
    DELETE FROM awa.active_jobs AS j
    WHERE j.id = %(id)s AND j.state::text = 'running' AND j.run_lease = %(lease)s
    RETURNING j.*
)
INSERT INTO awa.done_jobs
SELECT r.* FROM moved AS m
CROSS JOIN LATERAL awa.as_done(to_jsonb(m) || jsonb_build_object(
    'state', 'completed', 'finalized_at', now(), 'heartbeat_at', NULL, 'deadline_at', NULL,
    'progress', NULL, 'output', %(output)s::jsonb
)) AS r
RETURNING *

-- name: retry_job_attempt
-- A failed attempt (an exception, or RetryAfter): retryable with a delay while attempts
-- remain, failed on the last one. An error entry is appended when one is given
-- (RetryAfter with attempts left records none). delay_seconds NULL means exponential backoff.
-- The row moves from active_jobs to held_jobs (moves between homes go through the row as
-- JSON: every column travels, whatever later migrations add).
WITH moved AS (
    DELETE FROM awa.active_jobs AS j
    WHERE j.id = %(id)s AND j.state::text = 'running' AND j.run_lease = %(lease)s
    RETURNING j.*
)
INSERT INTO awa.held_jobs
SELECT r.* FROM moved AS m
CROSS JOIN LATERAL awa.as_held(to_jsonb(m) || jsonb_build_object(
    'state', CASE WHEN m.attempt >= m.max_attempts THEN 'failed' ELSE 'retryable' END,
    'run_at', CASE WHEN m.attempt >= m.max_attempts THEN m.run_at
                   WHEN %(delay_seconds)s::double precision IS NULL
                   THEN now() + awa.retry_delay(m.attempt, %(base)s, %(jitter)s, %(max_delay)s)
                   ELSE now() + make_interval(secs => %(delay_seconds)s::double precision) END,
    'finalized_at', now(), 'heartbeat_at', NULL, 'deadline_at', NULL,
    'progress', COALESCE(%(progress)s::jsonb, m.progress),
    'errors', CASE
        WHEN m.attempt >= m.max_attempts THEN m.errors || jsonb_build_array(jsonb_build_object(
            'error', COALESCE(%(error)s::text, %(exhausted_error)s::text),
            'attempt', m.attempt, 'at', now()))
        WHEN %(error)s::text IS NULL THEN m.errors
        ELSE m.errors || jsonb_build_array(jsonb_build_object(
            'error', %(error)s::text, 'attempt', m.attempt, 'at', now()))
    END
)) AS r
RETURNING *

-- name: fail_job_attempt
-- A terminal failure: failed now whatever the attempts left.
WITH moved AS (
    DELETE FROM awa.active_jobs AS j
    WHERE j.id = %(id)s AND j.state::text = 'running' AND j.run_lease = %(lease)s
    RETURNING j.*
)
INSERT INTO awa.held_jobs
SELECT r.* FROM moved AS m
CROSS JOIN LATERAL awa.as_held(to_jsonb(m) || jsonb_build_object(
    'state', 'failed', 'finalized_at', now(), 'heartbeat_at', NULL, 'deadline_at', NULL,
    'progress', COALESCE(%(progress)s::jsonb, m.progress),
    'errors', m.errors || jsonb_build_array(jsonb_build_object(
        'error', %(error)s::text, 'attempt', m.attempt, 'at', now(), 'terminal', true))
)) AS r
RETURNING *

-- name: cancel_job_attempt
WITH moved AS (
    DELETE FROM awa.active_jobs AS j
    WHERE j.id = %(id)s AND j.state::text = 'running' AND j.run_lease = %(lease)s
    RETURNING j.*
)
INSERT INTO awa.held_jobs
SELECT r.* FROM moved AS m
CROSS JOIN LATERAL awa.as_held(to_jsonb(m) || jsonb_build_object(
    'state', 'cancelled', 'finalized_at', now(), 'heartbeat_at', NULL, 'deadline_at', NULL,
    'progress', COALESCE(%(progress)s::jsonb, m.progress),
    'errors', m.errors || jsonb_build_array(jsonb_build_object(
        'error', 'cancelled: ' || %(reason)s::text, 'attempt', m.attempt, 'at', now()))
)) AS r
RETURNING *

-- name: snooze_job_attempt
-- Snooze gives back the attempt the claim took: it is a reschedule, not a failure.
WITH moved AS (
    DELETE FROM awa.active_jobs AS j
    WHERE j.id = %(id)s AND j.state::text = 'running' AND j.run_lease = %(lease)s
    RETURNING j.*
)
INSERT INTO awa.held_jobs
SELECT r.* FROM moved AS m
CROSS JOIN LATERAL awa.as_held(to_jsonb(m) || jsonb_build_object(
    'state', 'scheduled', 'attempt', m.attempt - 1,
    'run_at', now() + make_interval(secs => %(delay_seconds)s::double precision),
    'heartbeat_at', NULL, 'deadline_at', NULL,
    'progress', COALESCE(%(progress)s::jsonb, m.progress)
)) AS r
RETURNING *

-- name: requeue_interrupted
-- An attempt cut short by worker shutdown goes back to available without consuming the
-- attempt; the interruption is recorded in the error history. The queue is notified so
-- other workers take the job at once.
WITH requeued AS (
    UPDATE awa.active_jobs
    SET state = 'available', attempt = attempt - 1, run_at = now(), heartbeat_at = NULL,
        deadline_at = NULL, attempted_at = NULL,
        progress = COALESCE(%(progress)s::jsonb, progress),
        errors = errors || jsonb_build_array(jsonb_build_object(
            'error', %(error)s::text, 'attempt', attempt, 'at', now()))
    WHERE id = %(id)s AND state::text = 'running' AND run_lease = %(lease)s
    RETURNING *
)
SELECT r.* FROM requeued AS r
CROSS JOIN LATERAL (SELECT pg_notify('awa_jobs', r.queue)) AS n

-- name: cancel_duplicate_attempt
-- Fallback when an outcome would move a job back into its unique mask while a newer job
-- holds the key: the newer job wins and this one is cancelled, with the reason recorded.
WITH moved AS (
    DELETE FROM awa.active_jobs AS j
    WHERE j.id = %(id)s AND j.state::text = 'running' AND j.run_lease = %(lease)s
    RETURNING j.*
)
INSERT INTO awa.held_jobs
SELECT r.* FROM moved AS m
CROSS JOIN LATERAL awa.as_held(to_jsonb(m) || jsonb_build_object(
    'state', 'cancelled', 'finalized_at', now(), 'heartbeat_at', NULL, 'deadline_at', NULL,
    'errors', m.errors || jsonb_build_array(jsonb_build_object(
        'error', %(error)s::text, 'attempt', m.attempt, 'at', now()))
)) AS r
RETURNING *

-- name: heartbeat
-- Refreshes heartbeat_at of this process's running attempts (and stores progress that
-- changed); returns the ids it refreshed. A row another transaction holds is skipped, not
-- waited for: it is being completed (complete_batch locks the slots one after the other, in
-- no order a beat could share, so waiting could deadlock), moved by the rotation or
-- changed by an operator, and the next beat refreshes it. A beat lost in a server crash
-- costs nothing, so it does not wait for its WAL flush.
WITH durability AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
), locked AS (
    SELECT j.id FROM awa.active_jobs AS j, durability
    WHERE j.id = ANY(%(ids)s::bigint[]) AND j.state::text = 'running'
      AND j.run_lease = (%(leases)s::bigint[])[array_position(%(ids)s::bigint[], j.id)]
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE awa.active_jobs AS j
SET heartbeat_at = now(),
    progress = COALESCE((%(progress)s::jsonb[])[array_position(%(ids)s::bigint[], j.id)],
                        j.progress)
WHERE j.id = ANY(ARRAY(SELECT id FROM locked))
RETURNING j.id

-- name: flush_progress
UPDATE awa.active_jobs SET progress = %(progress)s::jsonb
WHERE id = %(id)s AND state::text = 'running' AND run_lease = %(lease)s
RETURNING id

-- name: listen_channels
LISTEN awa_jobs;
LISTEN awa_ready;
LISTEN awa_cancel;
LISTEN awa_callbacks;
LISTEN awa_overrides

-- name: attempt_lost
-- Raises (SQLSTATE AWA01), aborting the caller's transaction: see migration 18.
SELECT awa.attempt_lost(%(id)s, %(lease)s)

-- name: attempt_evidence
-- What became of an attempt whose completion a handler wrote in its own transaction: the
-- job's row now (completed under this lease: it committed; running under it: it did not).
SELECT * FROM awa.jobs WHERE id = %(id)s
