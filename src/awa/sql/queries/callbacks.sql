-- External callbacks: a running attempt registers a callback id, parks the job (or waits in
-- its handler), and an outside system resolves it by that id.
--
-- Resolutions match the callback id in an accepted state (and the run_lease when the caller
-- gives one), and clear every callback column: a second resolution, or one with a stale id,
-- matches nothing. Row locks make concurrent resolutions of one callback take turns, so
-- exactly one of them changes the row.

-- name: register_callback
-- Replaces any earlier callback of this attempt, so an old token goes stale.
UPDATE awa.jobs
SET callback_id = %(callback_id)s::uuid,
    callback_timeout_at = now() + make_interval(secs => %(timeout_seconds)s::double precision),
    callback_filter = %(filter)s,
    callback_on_complete = %(on_complete)s,
    callback_on_fail = %(on_fail)s,
    callback_transform = %(transform)s,
    callback_in_handler = false
WHERE id = %(id)s AND state = 'running' AND run_lease = %(lease)s
RETURNING callback_timeout_at

-- name: park_job_attempt
-- The handler returned WaitForCallback: the job waits in waiting_external without a slot,
-- heartbeat or deadline. If the callback was already resumed while the handler was still
-- running (its id is cleared and the payload stored), the job goes straight back to
-- available to run again, giving back the attempt like a resume does.
UPDATE awa.jobs
SET state = (CASE WHEN callback_id IS NULL THEN 'available' ELSE 'waiting_external' END)
        ::awa.job_state,
    attempt = CASE WHEN callback_id IS NULL THEN attempt - 1 ELSE attempt END,
    run_at = CASE WHEN callback_id IS NULL THEN now() ELSE run_at END,
    heartbeat_at = NULL,
    deadline_at = NULL,
    callback_in_handler = false,
    progress = COALESCE(%(progress)s::jsonb, progress)
WHERE id = %(id)s AND state = 'running' AND run_lease = %(lease)s
  AND (callback_id = %(callback_id)s::uuid
       OR (callback_id IS NULL AND metadata ? '_awa_callback_result'))
RETURNING *

-- name: fail_unregistered_wait
-- WaitForCallback with a token this attempt does not hold (never registered, or replaced).
UPDATE awa.jobs
SET state = 'failed', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
    progress = COALESCE(%(progress)s::jsonb, progress),
    errors = errors || jsonb_build_array(jsonb_build_object(
        'error', 'WaitForCallback returned without a registered callback: call '
                 || 'await job.register_callback() and return WaitForCallback(token)',
        'attempt', attempt, 'at', now(), 'terminal', true))
WHERE id = %(id)s AND state = 'running' AND run_lease = %(lease)s
RETURNING *

-- name: enter_callback_wait
-- job.wait_for_callback(): the handler keeps its slot while the row shows waiting_external.
UPDATE awa.jobs
SET state = 'waiting_external', callback_in_handler = true, heartbeat_at = NULL,
    deadline_at = NULL
WHERE id = %(id)s AND state = 'running' AND run_lease = %(lease)s
  AND callback_id = %(callback_id)s::uuid
RETURNING id

-- name: leave_callback_wait
-- The handler stopped waiting without a payload (shutdown, interruption): the row goes back
-- to running, callback kept, so the attempt's outcome applies to it as to any running job.
UPDATE awa.jobs
SET state = 'running', callback_in_handler = false, heartbeat_at = now()
WHERE id = %(id)s AND state = 'waiting_external' AND run_lease = %(lease)s
  AND callback_in_handler AND callback_id = %(callback_id)s::uuid
RETURNING id

-- name: callback_wait_state
SELECT state::text AS state, run_lease, callback_id,
       metadata ? '_awa_callback_result' AS resumed,
       metadata -> '_awa_callback_result' AS payload
FROM awa.jobs WHERE id = %(id)s

-- name: take_callback_result
UPDATE awa.jobs SET metadata = metadata - '_awa_callback_result'
WHERE id = %(id)s AND state = 'running' AND run_lease = %(lease)s
RETURNING id

-- name: resume_callback
-- Hands a payload to the job (metadata._awa_callback_result). A handler waiting in
-- wait_for_callback continues (state running, notified on awa_callbacks); a job parked by
-- returning WaitForCallback runs again (state available, the attempt given back, its queue
-- notified); a job still running before it parked keeps running and finds the payload.
WITH target AS (
    SELECT id, state AS prior_state, callback_in_handler FROM awa.jobs
    WHERE callback_id = %(callback_id)s::uuid
      AND state IN ('waiting_external', 'running')
      AND (%(lease)s::bigint IS NULL OR run_lease = %(lease)s::bigint)
    FOR UPDATE
), resumed AS (
    UPDATE awa.jobs AS j
    SET state = (CASE WHEN t.prior_state = 'waiting_external' AND NOT t.callback_in_handler
                      THEN 'available' ELSE 'running' END)::awa.job_state,
        attempt = CASE WHEN t.prior_state = 'waiting_external' AND NOT t.callback_in_handler
                       THEN j.attempt - 1 ELSE j.attempt END,
        run_at = CASE WHEN t.prior_state = 'waiting_external' AND NOT t.callback_in_handler
                      THEN now() ELSE j.run_at END,
        heartbeat_at = CASE WHEN t.prior_state = 'waiting_external' AND NOT t.callback_in_handler
                            THEN NULL ELSE now() END,
        callback_id = NULL, callback_timeout_at = NULL, callback_filter = NULL,
        callback_on_complete = NULL, callback_on_fail = NULL, callback_transform = NULL,
        callback_in_handler = false,
        metadata = jsonb_set(j.metadata, '{_awa_callback_result}',
                             COALESCE(%(payload)s::jsonb, 'null'::jsonb))
    FROM target AS t
    WHERE j.id = t.id
    RETURNING j.*
)
SELECT r.* FROM resumed AS r
CROSS JOIN LATERAL (
    SELECT CASE WHEN r.state = 'available' THEN pg_notify('awa_jobs', r.queue)
                ELSE pg_notify('awa_callbacks', r.id::text) END
) AS n

-- name: complete_callback
-- The payload, when given, becomes the job's output.
UPDATE awa.jobs
SET state = 'completed', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
    progress = NULL, output = COALESCE(%(payload)s::jsonb, output),
    callback_id = NULL, callback_timeout_at = NULL, callback_filter = NULL,
    callback_on_complete = NULL, callback_on_fail = NULL, callback_transform = NULL,
    callback_in_handler = false
WHERE callback_id = %(callback_id)s::uuid
  AND state IN ('waiting_external', 'running')
  AND (%(lease)s::bigint IS NULL OR run_lease = %(lease)s::bigint)
RETURNING *

-- name: fail_callback
UPDATE awa.jobs
SET state = 'failed', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
    errors = errors || jsonb_build_array(
        jsonb_build_object('error', %(error)s::text, 'attempt', attempt, 'at', now(),
                           'terminal', true)
        || CASE WHEN %(expression)s::text IS NULL THEN '{}'::jsonb
                ELSE jsonb_build_object('expression', %(expression)s::text) END),
    callback_id = NULL, callback_timeout_at = NULL, callback_filter = NULL,
    callback_on_complete = NULL, callback_on_fail = NULL, callback_transform = NULL,
    callback_in_handler = false
WHERE callback_id = %(callback_id)s::uuid
  AND state IN ('waiting_external', 'running')
  AND (%(lease)s::bigint IS NULL OR run_lease = %(lease)s::bigint)
RETURNING *

-- name: retry_callback
-- Parked jobs only: the job runs again from a fresh attempt budget. Returns the attempt
-- that parked, for the Retried event.
WITH parked AS (
    SELECT id, attempt FROM awa.jobs
    WHERE callback_id = %(callback_id)s::uuid AND state = 'waiting_external'
      AND (%(lease)s::bigint IS NULL OR run_lease = %(lease)s::bigint)
    FOR UPDATE
), retried AS (
    UPDATE awa.jobs AS j
    SET state = 'available', attempt = 0, run_at = now(), finalized_at = NULL,
        heartbeat_at = NULL, deadline_at = NULL,
        callback_id = NULL, callback_timeout_at = NULL, callback_filter = NULL,
        callback_on_complete = NULL, callback_on_fail = NULL, callback_transform = NULL,
        callback_in_handler = false
    FROM parked AS p
    WHERE j.id = p.id
    RETURNING j.*, p.attempt AS parked_attempt
)
SELECT r.* FROM retried AS r CROSS JOIN LATERAL (SELECT pg_notify('awa_jobs', r.queue)) AS n

-- name: heartbeat_callback
UPDATE awa.jobs
SET callback_timeout_at = now() + make_interval(secs => %(timeout_seconds)s::double precision)
WHERE callback_id = %(callback_id)s::uuid AND state = 'waiting_external'
RETURNING *

-- name: lock_callback
-- resolve_callback reads the expressions under a row lock, decides, then transitions.
SELECT * FROM awa.jobs
WHERE callback_id = %(callback_id)s::uuid
  AND state IN ('waiting_external', 'running')
  AND (%(lease)s::bigint IS NULL OR run_lease = %(lease)s::bigint)
FOR UPDATE
