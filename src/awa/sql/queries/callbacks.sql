-- External callbacks: a running attempt registers a callback id, parks the job (or waits in
-- its handler), and an outside system resolves it by that id.
--
-- Resolutions match the callback id in an accepted state (and the run_lease when the caller
-- gives one), and clear every callback column: a second resolution, or one with a stale id,
-- matches nothing. Row locks make concurrent resolutions of one callback take turns, so
-- exactly one of them changes the row. A running job lives in awa.active_jobs, a parked one
-- in awa.held_jobs. The attempt's own statements move its row between them in one
-- statement whose condition is checked again on the row as it is once locked (a resolution
-- that got there first makes it match nothing); the resolutions lock the job wherever it is
-- (awa.locked_callback_job), then change it through the awa.jobs view.

-- name: register_callback
-- Replaces any earlier callback of this attempt, so an old token goes stale.
UPDATE awa.active_jobs
SET callback_id = %(callback_id)s::uuid,
    callback_timeout_at = now() + make_interval(secs => %(timeout_seconds)s::double precision),
    callback_filter = %(filter)s,
    callback_on_complete = %(on_complete)s,
    callback_on_fail = %(on_fail)s,
    callback_transform = %(transform)s,
    callback_in_handler = false
WHERE id = %(id)s AND state::text = 'running' AND run_lease = %(lease)s
RETURNING callback_timeout_at

-- name: park_job_attempt
-- The handler returned WaitForCallback: the job waits in waiting_external (held_jobs)
-- without a slot, heartbeat or deadline. If the callback was already resumed while the
-- handler was still running (its id is cleared and the payload stored), the job goes
-- straight back to available to run again, giving back the attempt like a resume does,
-- and its lane is announced (a change in place sends no insert's notification).
WITH requeued AS (
    UPDATE awa.active_jobs AS j
    SET state = 'available', attempt = j.attempt - 1, run_at = now(), heartbeat_at = NULL,
        deadline_at = NULL, callback_in_handler = false,
        progress = COALESCE(%(progress)s::jsonb, j.progress)
    WHERE j.id = %(id)s AND j.state::text = 'running' AND j.run_lease = %(lease)s
      AND j.callback_id IS NULL AND j.metadata ? '_awa_callback_result'
    RETURNING j.*
), moved AS (
    DELETE FROM awa.active_jobs AS j
    WHERE j.id = %(id)s AND j.state::text = 'running' AND j.run_lease = %(lease)s
      AND j.callback_id = %(callback_id)s::uuid
    RETURNING j.*
), parked AS (
    INSERT INTO awa.held_jobs
    SELECT r.* FROM moved AS m
    CROSS JOIN LATERAL awa.as_held(to_jsonb(m) || jsonb_build_object(
        'state', 'waiting_external', 'heartbeat_at', NULL, 'deadline_at', NULL,
        'callback_in_handler', false, 'progress', COALESCE(%(progress)s::jsonb, m.progress)
    )) AS r
    RETURNING *
)
SELECT v.* FROM requeued AS r
CROSS JOIN LATERAL awa.as_job(to_jsonb(r)) AS v
CROSS JOIN LATERAL (
    SELECT pg_notify('awa_ready', awa.ready_payload(r.priority, r.run_at, r.id, r.queue))
) AS n
UNION ALL
SELECT * FROM parked

-- name: enter_callback_wait
-- job.wait_for_callback(): the handler keeps its slot while the row shows waiting_external
-- (moved to held_jobs).
WITH moved AS (
    DELETE FROM awa.active_jobs AS j
    WHERE j.id = %(id)s AND j.state::text = 'running' AND j.run_lease = %(lease)s
      AND j.callback_id = %(callback_id)s::uuid
    RETURNING j.*
)
INSERT INTO awa.held_jobs
SELECT r.* FROM moved AS m
CROSS JOIN LATERAL awa.as_held(to_jsonb(m) || jsonb_build_object(
    'state', 'waiting_external', 'callback_in_handler', true, 'heartbeat_at', NULL,
    'deadline_at', NULL
)) AS r
RETURNING id

-- name: leave_callback_wait
-- The handler stopped waiting without a payload (shutdown, interruption): the row goes back
-- to running (to active_jobs), callback kept, so the attempt's outcome applies to it as to
-- any running job.
WITH moved AS (
    DELETE FROM awa.held_jobs AS j
    WHERE j.id = %(id)s AND j.state = 'waiting_external' AND j.run_lease = %(lease)s
      AND j.callback_in_handler AND j.callback_id = %(callback_id)s::uuid
    RETURNING j.*
)
INSERT INTO awa.active_jobs
SELECT r.* FROM moved AS m
CROSS JOIN LATERAL awa.as_active(to_jsonb(m) || jsonb_build_object(
    'state', 'running', 'callback_in_handler', false, 'heartbeat_at', now()
)) AS r
RETURNING id

-- name: callback_wait_state
SELECT state::text AS state, run_lease, callback_id,
       metadata ? '_awa_callback_result' AS resumed,
       metadata -> '_awa_callback_result' AS payload
FROM awa.jobs WHERE id = %(id)s

-- name: take_callback_result
UPDATE awa.active_jobs SET metadata = metadata - '_awa_callback_result'
WHERE id = %(id)s AND state::text = 'running' AND run_lease = %(lease)s
RETURNING id

-- name: resume_callback
-- Hands a payload to the job (metadata._awa_callback_result). A handler waiting in
-- wait_for_callback continues (state running, notified on awa_callbacks); a job parked by
-- returning WaitForCallback runs again (state available, the attempt given back, its queue
-- notified); a job still running before it parked keeps running and finds the payload.
SELECT r.* FROM awa.resume_callback_job(
    %(callback_id)s::uuid, %(lease)s::bigint, %(payload)s::jsonb
) AS r
CROSS JOIN LATERAL (
    SELECT CASE WHEN r.state = 'available' THEN pg_notify('awa_jobs', r.queue)
                ELSE pg_notify('awa_callbacks', r.id::text) END
) AS n

-- name: complete_callback
-- The payload, when given, becomes the job's output.
SELECT * FROM awa.complete_callback_job(
    %(callback_id)s::uuid, %(lease)s::bigint, %(payload)s::jsonb
)

-- name: fail_callback
SELECT * FROM awa.fail_callback_job(
    %(callback_id)s::uuid, %(lease)s::bigint, %(error)s::text, %(expression)s::text
)

-- name: retry_callback
-- Parked jobs only: the job runs again from a fresh attempt budget. Returns the attempt
-- that parked, for the Retried event.
SELECT (r.job).*, r.parked_attempt
FROM awa.retry_callback_job(%(callback_id)s::uuid, %(lease)s::bigint) AS r
CROSS JOIN LATERAL (SELECT pg_notify('awa_jobs', (r.job).queue)) AS n

-- name: heartbeat_callback
UPDATE awa.held_jobs
SET callback_timeout_at = now() + make_interval(secs => %(timeout_seconds)s::double precision)
WHERE callback_id = %(callback_id)s::uuid AND state = 'waiting_external'
RETURNING *

-- name: lock_callback
-- resolve_callback reads the expressions under a row lock, decides, then transitions.
SELECT j.* FROM awa.locked_callback_job(
    %(callback_id)s::uuid, %(lease)s::bigint,
    ARRAY['waiting_external', 'running']::awa.job_state[]
) AS j
WHERE j.id IS NOT NULL
