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
