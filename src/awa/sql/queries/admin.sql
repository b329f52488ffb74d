-- Operator actions. Each is a single statement so that it runs the same way on a blocking
-- connection, an asyncio connection, or inside a caller's transaction. None of them fire
-- lifecycle hooks or follow-ups.

-- name: get_job
SELECT * FROM awa.jobs WHERE id = %(id)s

-- name: list_jobs
-- Newest first. NULL filters match everything.
SELECT * FROM awa.jobs
WHERE (%(state)s::awa.job_state IS NULL OR state = %(state)s::awa.job_state)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
ORDER BY id DESC
LIMIT %(limit)s

-- name: cancel_job
-- Any job that has not finished may be cancelled (awa.cancel_jobs locks it wherever it is,
-- then cancels it). The running attempt of a running or parked job is not interrupted by
-- the database: its later writes miss the state = 'running' guard, and the awa_cancel
-- notification lets the process that runs it flip job.is_cancelled().
SELECT (c.job).*, c.prior_state
FROM awa.cancel_jobs(ARRAY[%(id)s::bigint], NULL) AS c
LEFT JOIN LATERAL (
    SELECT pg_notify('awa_cancel',
                     json_build_object('job_id', (c.job).id, 'run_lease', (c.job).run_lease)::text)
    WHERE c.prior_state IN ('running', 'waiting_external')
) AS n ON true

-- name: cancel_by_unique_key
-- Cancels the oldest unfinished job with the key (same effects as cancel_job): the job
-- holding it (awa.unique_keys), or a job in a state outside its mask (a parked one, say),
-- which can only be in held_jobs for the default mask.
SELECT (c.job).*, c.prior_state
FROM awa.cancel_jobs(ARRAY(
    SELECT min(w.id) FROM (
        SELECT k.job_id AS id FROM awa.unique_keys AS k WHERE k.unique_key = %(key)s
        UNION ALL
        SELECT h.id FROM awa.held_jobs AS h
        WHERE h.unique_key = %(key)s AND h.state NOT IN ('failed', 'cancelled')
    ) AS w
), NULL) AS c
LEFT JOIN LATERAL (
    SELECT pg_notify('awa_cancel',
                     json_build_object('job_id', (c.job).id, 'run_lease', (c.job).run_lease)::text)
    WHERE c.prior_state IN ('running', 'waiting_external')
) AS n ON true

-- name: retry_job
-- Failed, cancelled and parked jobs run again from a fresh attempt budget. The error
-- history is kept. Moving back into a unique mask can collide with a newer duplicate, which
-- raises a unique violation and changes nothing.
WITH moved AS (
    UPDATE awa.jobs
    SET state = 'available', attempt = 0, run_at = now(), finalized_at = NULL,
        heartbeat_at = NULL, deadline_at = NULL,
        callback_id = NULL, callback_timeout_at = NULL, callback_filter = NULL,
        callback_on_complete = NULL, callback_on_fail = NULL, callback_transform = NULL
    WHERE id = %(id)s AND state IN ('failed', 'cancelled', 'waiting_external')
    RETURNING *
)
SELECT m.* FROM moved AS m
CROSS JOIN LATERAL (SELECT pg_notify('awa_jobs', m.queue)) AS n

-- name: retry_failed
-- A failed job whose unique key another job holds now stays failed (moving it would break
-- the key), and of several failed jobs sharing a key only the newest runs again: the rest
-- of the batch goes ahead instead of the whole statement failing on the unique index.
WITH failed AS (
    SELECT f.id, f.unique_key,
           f.unique_key IS NOT NULL
               AND awa.unique_key_held(f.unique_states, 'available') AS takes_key
    FROM awa.jobs AS f
    WHERE f.state = 'failed'
      AND (%(kind)s::text IS NULL OR f.kind = %(kind)s::text)
      AND (%(queue)s::text IS NULL OR f.queue = %(queue)s::text)
      AND (%(ids)s::bigint[] IS NULL OR f.id = ANY(%(ids)s::bigint[]))
), chosen AS (
    SELECT id FROM failed WHERE NOT takes_key
    UNION ALL
    SELECT newest.id FROM (
        SELECT DISTINCT ON (unique_key) id, unique_key FROM failed
        WHERE takes_key
        ORDER BY unique_key, id DESC
    ) AS newest
    WHERE NOT EXISTS (
        SELECT 1 FROM awa.unique_keys AS holder WHERE holder.unique_key = newest.unique_key
    )
), moved AS (
    UPDATE awa.jobs AS j
    SET state = 'available', attempt = 0, run_at = now(), finalized_at = NULL,
        heartbeat_at = NULL, deadline_at = NULL
    FROM chosen
    WHERE j.id = chosen.id AND j.state = 'failed'
    RETURNING j.*
)
SELECT m.* FROM moved AS m
CROSS JOIN LATERAL (SELECT pg_notify('awa_jobs', m.queue)) AS n

-- name: retry_failed_matched
-- How many failed jobs the filter of retry_failed matches (moved or left for their key).
SELECT count(*) AS count FROM awa.jobs
WHERE state = 'failed'
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))

-- name: discard_failed
WITH gone AS (
    DELETE FROM awa.jobs
    WHERE state = 'failed'
      AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
      AND (%(ids)s::bigint[] IS NULL OR id = ANY(%(ids)s::bigint[]))
    RETURNING 1
)
SELECT count(*) AS count FROM gone

-- name: discard_job
-- Deletes a job no attempt holds: not while it runs or waits on a callback (cancel first).
DELETE FROM awa.jobs
WHERE id = %(id)s AND state NOT IN ('running', 'waiting_external')
RETURNING id

-- name: run_job_now
-- A scheduled or retryable job becomes available at once (it keeps its attempt count).
WITH moved AS (
    UPDATE awa.jobs SET state = 'available', run_at = now()
    WHERE id = %(id)s AND state IN ('scheduled', 'retryable')
    RETURNING *
)
SELECT m.* FROM moved AS m
CROSS JOIN LATERAL (SELECT pg_notify('awa_jobs', m.queue)) AS n

-- name: pause_queue
INSERT INTO awa.queues (queue, paused, paused_at, paused_by)
VALUES (%(queue)s, true, now(), %(paused_by)s)
ON CONFLICT (queue) DO UPDATE
SET paused = true, paused_at = now(), paused_by = EXCLUDED.paused_by
RETURNING queue

-- name: queue_known
-- Whether the queue has been used: a job (of any state) names it, or it has a row in
-- awa.queues (paused before). No index leads with queue alone, so for a name no job carries
-- this reads the whole table: an operator's check, not a hot path.
SELECT EXISTS (SELECT 1 FROM awa.queues WHERE queue = %(queue)s)
    OR EXISTS (SELECT 1 FROM awa.jobs WHERE queue = %(queue)s) AS known

-- name: resume_queue
-- Resuming wakes the queue's workers at once instead of at their next poll.
WITH resumed AS (
    UPDATE awa.queues SET paused = false, paused_at = NULL, paused_by = NULL
    WHERE queue = %(queue)s AND paused
    RETURNING queue
)
SELECT r.queue FROM resumed AS r
CROSS JOIN LATERAL (SELECT pg_notify('awa_jobs', r.queue)) AS n

-- name: drain_queue
-- Cancels every job of the queue that waits to run (available, scheduled, retryable,
-- blocked on dependencies) or is parked on a callback. Running jobs finish their attempt.
WITH drained AS (
    UPDATE awa.jobs
    SET state = 'cancelled', finalized_at = now(), heartbeat_at = NULL, deadline_at = NULL,
        callback_id = NULL, callback_timeout_at = NULL, callback_filter = NULL,
        callback_on_complete = NULL, callback_on_fail = NULL, callback_transform = NULL
    WHERE queue = %(queue)s
      AND state IN ('available', 'scheduled', 'retryable', 'waiting_external', 'blocked')
    RETURNING 1
)
SELECT count(*) AS count FROM drained

-- name: queue_stats
-- Per queue: counts by state, the age of the oldest job waiting to be claimed, and the
-- fleet-wide limits with the due jobs each holds back right now: a key at its limit holds
-- that key's jobs; a queue at its cap, or with an empty token bucket, holds the rest.
-- Completed jobs are counted by awa.completed_counts (migration 12): exact, without reading
-- every completed row.
WITH completed AS (
    SELECT * FROM awa.completed_counts(now() - interval '1 hour')
), counts AS (
    SELECT queue, state, count(*) AS n FROM awa.jobs
    WHERE state <> 'completed'
    GROUP BY queue, state
    UNION ALL
    SELECT queue, 'completed', total FROM completed WHERE total > 0
), per_queue AS (
    SELECT queue, jsonb_object_agg(state, n) AS counts FROM counts GROUP BY queue
), oldest AS (
    SELECT queue, min(run_at) AS oldest_run_at, count(*) FILTER (WHERE run_at <= now()) AS due
    FROM awa.jobs WHERE state = 'available' GROUP BY queue
), limits AS (
    SELECT l.*,
           CASE WHEN l.rate IS NOT NULL THEN least(
               l.burst, l.tokens + EXTRACT(EPOCH FROM clock_timestamp() - l.tokens_at) * l.rate
           ) END AS tokens_now
    FROM awa.queue_limits AS l
), full_keys AS (
    SELECT r.queue, r.concurrency_key
    FROM awa.jobs AS r JOIN limits AS l ON l.queue = r.queue
    WHERE r.state = 'running' AND r.concurrency_key IS NOT NULL
      AND l.key_concurrency IS NOT NULL
    GROUP BY r.queue, r.concurrency_key, l.key_concurrency
    HAVING count(*) >= l.key_concurrency
), held_by_keys AS (
    SELECT j.queue, count(*) AS n
    FROM awa.jobs AS j JOIN full_keys AS f
        ON f.queue = j.queue AND f.concurrency_key = j.concurrency_key
    WHERE j.state = 'available' AND j.run_at <= now()
    GROUP BY j.queue
), recent AS (
    SELECT queue, since AS n FROM completed
), names AS (
    SELECT queue FROM per_queue UNION SELECT queue FROM awa.queues
    UNION SELECT queue FROM awa.queue_limits
)
SELECT names.queue,
       COALESCE(recent.n, 0) AS completed_last_hour,
       COALESCE(per_queue.counts, '{}'::jsonb) AS counts,
       oldest.oldest_run_at,
       -- GREATEST ignores NULLs, so test for a missing oldest job explicitly.
       CASE WHEN oldest.oldest_run_at IS NOT NULL
            THEN GREATEST(EXTRACT(EPOCH FROM now() - oldest.oldest_run_at), 0)::double precision
       END
           AS oldest_available_age,
       COALESCE(q.paused, false) AS paused,
       q.paused_by,
       l.rate, l.burst, l.max_running, l.key_concurrency,
       COALESCE(k.n, 0) AS held_by_keys,
       CASE WHEN COALESCE((per_queue.counts ->> 'running')::bigint, 0) >= l.max_running
            THEN COALESCE(oldest.due, 0) - COALESCE(k.n, 0) ELSE 0 END AS held_by_cap,
       CASE WHEN l.tokens_now < 1
             AND NOT COALESCE((per_queue.counts ->> 'running')::bigint, 0)
                     >= COALESCE(l.max_running, 2147483647)
            THEN COALESCE(oldest.due, 0) - COALESCE(k.n, 0) ELSE 0 END AS held_by_rate
FROM names
LEFT JOIN per_queue ON per_queue.queue = names.queue
LEFT JOIN oldest ON oldest.queue = names.queue
LEFT JOIN awa.queues AS q ON q.queue = names.queue
LEFT JOIN limits AS l ON l.queue = names.queue
LEFT JOIN held_by_keys AS k ON k.queue = names.queue
LEFT JOIN recent ON recent.queue = names.queue
ORDER BY names.queue
