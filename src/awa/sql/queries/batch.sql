-- Durable batch operations (migration 0009): submitted by operators, carried out by the
-- maintenance leader in bounded steps. Only queued jobs (available, scheduled) are changed.
-- Filters are NULL when unset; each statement is planned with its values, so an unset
-- filter folds away.

-- name: batch_submit
-- The snapshot's upper bound is the largest job id at submission: jobs inserted later are
-- never part of the operation.
INSERT INTO awa.batch_operations (id, op_kind, filter, spec, state, submitted_by, cursor)
VALUES (
    %(id)s, %(op_kind)s, %(filter)s::jsonb, %(spec)s::jsonb, 'pending', %(submitted_by)s,
    jsonb_build_object('after_job_id', 0,
                       'max_job_id', (SELECT COALESCE(max(id), 0) FROM awa.jobs))
)
RETURNING *

-- name: batch_preview
-- The first %(limit)s queued jobs the filter matches (by id), each carrying in `matched`
-- how many it matches in all (the window counts before the limit); no row: none.
SELECT *, count(*) OVER () AS matched FROM awa.jobs
WHERE state IN ('available', 'scheduled')
  AND (%(state)s::awa.job_state IS NULL OR state = %(state)s::awa.job_state)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
  AND (%(ids)s::bigint[] IS NULL OR id = ANY (%(ids)s::bigint[]))
  AND (%(created_at_gte)s::timestamptz IS NULL OR created_at >= %(created_at_gte)s::timestamptz)
  AND (%(created_at_lt)s::timestamptz IS NULL OR created_at < %(created_at_lt)s::timestamptz)
ORDER BY id
LIMIT %(limit)s

-- name: batch_list
SELECT * FROM awa.batch_operations
WHERE (%(state)s::text IS NULL OR state = %(state)s::text)
ORDER BY submitted_at DESC, id DESC
LIMIT %(limit)s

-- name: batch_get
SELECT * FROM awa.batch_operations WHERE id = %(id)s

-- name: batch_cancel
UPDATE awa.batch_operations
SET state = 'cancelling', updated_at = clock_timestamp()
WHERE id = %(id)s AND state IN ('pending', 'scanning', 'running')
RETURNING *

-- name: batch_purge
WITH purged AS (
    DELETE FROM awa.batch_operations
    WHERE id IN (
        SELECT id FROM awa.batch_operations
        WHERE finalized_at < %(before)s AND state IN ('completed', 'cancelled', 'failed')
        ORDER BY finalized_at
        LIMIT %(limit)s
    )
    RETURNING 1
)
SELECT count(*) AS count FROM purged

-- name: batch_next
-- The leader's next operation: cancellations first (they end at their next step), then the
-- oldest submitted.
SELECT * FROM awa.batch_operations
WHERE state IN ('pending', 'scanning', 'running', 'cancelling')
ORDER BY state = 'cancelling' DESC, submitted_at, id
LIMIT 1

-- name: batch_start
UPDATE awa.batch_operations
SET state = 'scanning', started_at = clock_timestamp(), runner_instance = %(runner)s,
    total_matched = 0, updated_at = clock_timestamp()
WHERE id = %(id)s AND state = 'pending'
RETURNING *

-- name: batch_scan_page
-- One page of the snapshot: the next %(page)s jobs by id up to the bound (so each step
-- reads a bounded number of rows however few match), of which the queued ones matching the
-- filter become items. A page shorter than %(page)s ends the scan.
WITH visited AS (
    SELECT id, kind, queue, state, tags, created_at FROM awa.jobs
    WHERE id > %(after)s AND id <= %(max_id)s
      AND (%(ids)s::bigint[] IS NULL OR id = ANY (%(ids)s::bigint[]))
    ORDER BY id
    LIMIT %(page)s
), matched AS (
    INSERT INTO awa.batch_operation_items (operation_id, job_id)
    SELECT %(id)s, v.id FROM visited AS v
    WHERE v.state IN ('available', 'scheduled')
      AND (%(state)s::awa.job_state IS NULL OR v.state = %(state)s::awa.job_state)
      AND (%(kind)s::text IS NULL OR v.kind = %(kind)s::text)
      AND (%(queue)s::text IS NULL OR v.queue = %(queue)s::text)
      AND (%(tag)s::text IS NULL OR v.tags @> ARRAY[%(tag)s::text])
      AND (%(created_at_gte)s::timestamptz IS NULL
           OR v.created_at >= %(created_at_gte)s::timestamptz)
      AND (%(created_at_lt)s::timestamptz IS NULL
           OR v.created_at < %(created_at_lt)s::timestamptz)
    ON CONFLICT DO NOTHING
    RETURNING job_id
)
UPDATE awa.batch_operations AS op
SET total_matched = COALESCE(op.total_matched, 0) + (SELECT count(*) FROM matched),
    cursor = jsonb_build_object(
        'after_job_id', COALESCE((SELECT max(id) FROM visited), %(max_id)s),
        'max_job_id', %(max_id)s),
    state = CASE WHEN op.state = 'scanning' AND (SELECT count(*) FROM visited) < %(page)s
                 THEN 'running' ELSE op.state END,
    updated_at = clock_timestamp()
WHERE op.id = %(id)s
RETURNING op.*

-- name: batch_apply_chunk
-- One chunk: take the next items and change their jobs that are still queued and not
-- already as asked (the others count as skipped: claimed, finished, deleted meanwhile).
-- The state condition sits in the UPDATE itself, so a job a worker claims while this waits
-- for its row lock is re-checked and left alone. The first change records the original
-- priority and queue in the job's metadata. Moved available jobs wake their new queue.
WITH chunk AS (
    DELETE FROM awa.batch_operation_items
    WHERE operation_id = %(id)s AND job_id IN (
        SELECT job_id FROM awa.batch_operation_items
        WHERE operation_id = %(id)s
        ORDER BY job_id
        LIMIT %(limit)s
    )
    RETURNING job_id
), changed AS (
    UPDATE awa.jobs AS j
    SET priority = COALESCE(%(priority)s::smallint, j.priority),
        queue = COALESCE(%(queue)s::text, j.queue),
        metadata = j.metadata
            || CASE WHEN j.priority <> COALESCE(%(priority)s::smallint, j.priority)
                         AND NOT j.metadata ? '_awa_original_priority'
                    THEN jsonb_build_object('_awa_original_priority', j.priority)
                    ELSE '{}'::jsonb END
            || CASE WHEN j.queue <> COALESCE(%(queue)s::text, j.queue)
                         AND NOT j.metadata ? '_awa_original_queue'
                    THEN jsonb_build_object('_awa_original_queue', j.queue)
                    ELSE '{}'::jsonb END
    FROM chunk
    WHERE j.id = chunk.job_id
      AND j.state IN ('available', 'scheduled')
      AND (j.priority <> COALESCE(%(priority)s::smallint, j.priority)
           OR j.queue <> COALESCE(%(queue)s::text, j.queue))
    RETURNING j.id, j.queue, j.state
), woken AS (
    SELECT pg_notify('awa_jobs', moved.queue)
    FROM (SELECT DISTINCT queue FROM changed WHERE state = 'available') AS moved
    WHERE %(queue)s::text IS NOT NULL
)
UPDATE awa.batch_operations AS op
SET processed = op.processed + (SELECT count(*) FROM changed),
    skipped = op.skipped + (SELECT count(*) FROM chunk) - (SELECT count(*) FROM changed),
    updated_at = clock_timestamp()
WHERE op.id = %(id)s
RETURNING (SELECT count(*) FROM chunk) AS taken, (SELECT count(*) FROM woken) AS woken

-- name: batch_complete
-- Only from running: an operation cancelled meanwhile ends as cancelled.
UPDATE awa.batch_operations
SET state = 'completed', finalized_at = clock_timestamp(),
    retention_until = clock_timestamp() + make_interval(secs => %(retention)s),
    updated_at = clock_timestamp()
WHERE id = %(id)s AND state = 'running'
RETURNING *

-- name: batch_cancel_step
-- A cancelled operation ends at its next step: the jobs it had not reached count as skipped
-- (items = total_matched - processed - skipped at every step); jobs it changed stay
-- changed. Its leftover items are dropped later, a page at a time (batch_drop_leftovers).
UPDATE awa.batch_operations
SET state = 'cancelled',
    skipped = COALESCE(total_matched, 0) - processed,
    finalized_at = clock_timestamp(),
    retention_until = clock_timestamp() + make_interval(secs => %(retention)s),
    updated_at = clock_timestamp()
WHERE id = %(id)s AND state = 'cancelling'
RETURNING *

-- name: batch_fail
-- A step failed for a reason retrying would not cure: the operation ends as failed, the
-- jobs it had not reached counted as errored.
UPDATE awa.batch_operations
SET state = 'failed', errored = COALESCE(total_matched, 0) - processed - skipped,
    last_error = %(error)s, finalized_at = clock_timestamp(),
    retention_until = clock_timestamp() + make_interval(secs => %(retention)s),
    updated_at = clock_timestamp()
WHERE id = %(id)s AND state IN ('pending', 'scanning', 'running', 'cancelling')
RETURNING *

-- name: batch_drop_leftovers
-- Items of operations that ended before reaching them (cancelled, failed), a page at a time
-- while no operation runs.
DELETE FROM awa.batch_operation_items
WHERE (operation_id, job_id) IN (
    SELECT i.operation_id, i.job_id
    FROM awa.batch_operation_items AS i
    JOIN awa.batch_operations AS op ON op.id = i.operation_id
    WHERE op.state IN ('completed', 'cancelled', 'failed')
    LIMIT %(limit)s
)

-- name: batch_expire
-- Finished operations past their retention, oldest first.
DELETE FROM awa.batch_operations
WHERE id IN (
    SELECT id FROM awa.batch_operations
    WHERE retention_until < now() AND state IN ('completed', 'cancelled', 'failed')
    ORDER BY retention_until
    LIMIT %(limit)s
)
