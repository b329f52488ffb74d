-- The operator web UI's reads. Each list is bounded (LIMIT, keyset cursors, never OFFSET)
-- and served by an index of awa.jobs, so that pages stay fast on tables of millions of rows.
-- Filters are NULL when unset: the server plans each statement with its values, so an unset
-- filter folds away and a state filter can use that state's partial index.

-- name: ui_queue_overview
-- Every queue anything knows of: sampled by the leader, paused, limited, or run by a live
-- worker; with its sample, pause status, the live workers that run it and its descriptor.
WITH names AS (
    SELECT queue FROM awa.queue_samples
    UNION SELECT queue FROM awa.queues
    UNION SELECT queue FROM awa.queue_limits
    UNION SELECT unnest(queues) FROM awa.runtimes WHERE heartbeat_at > now() - stale_after
), workers AS (
    SELECT q.queue, count(*) AS workers,
           -- Written by workers as numbers; any other stored value counts as none.
           COALESCE(sum(CASE WHEN jsonb_typeof(r.concurrency -> q.queue) = 'number'
                             THEN (r.concurrency ->> q.queue)::numeric END), 0) AS slots
    FROM awa.runtimes AS r
    CROSS JOIN LATERAL unnest(r.queues) AS q(queue)
    WHERE r.heartbeat_at > now() - r.stale_after
    GROUP BY q.queue
)
SELECT n.queue,
       COALESCE(s.counts, '{}') AS counts,
       COALESCE(s.finished_hour, '{}') AS finished_hour,
       COALESCE(s.unserved_kinds, '{}') AS unserved_kinds,
       EXTRACT(EPOCH FROM now() - s.oldest_available_at)::float8 AS lag,
       s.sampled_at,
       COALESCE(p.paused, false) AS paused,
       p.paused_by,
       COALESCE(w.workers, 0) AS workers,
       COALESCE(w.slots, 0) AS slots,
       d.display_name, d.description, d.owner, d.docs_url
FROM names AS n
LEFT JOIN awa.queue_samples AS s ON s.queue = n.queue
LEFT JOIN awa.queues AS p ON p.queue = n.queue
LEFT JOIN workers AS w ON w.queue = n.queue
LEFT JOIN awa.queue_descriptors AS d ON d.queue = n.queue
ORDER BY n.queue

-- name: ui_sample_age
-- Seconds since the newest queue sample (NULL when there is none).
SELECT EXTRACT(EPOCH FROM now() - max(sampled_at))::float8 AS age FROM awa.queue_samples

-- name: ui_runtimes
SELECT id, hostname, pid, application_name, version, queues, kinds, concurrency, is_leader,
       started_at, heartbeat_at
FROM awa.runtimes
WHERE heartbeat_at > now() - stale_after
ORDER BY is_leader DESC, started_at

-- name: ui_jobs_by_id
-- One page of jobs matching the filters, newest first, older than the cursor id (served by
-- the primary key, or a state's partial index). Arguments and errors are shown cut short.
SELECT id, kind, queue, state, priority, attempt, max_attempts, run_at, created_at,
       attempted_at, finalized_at, tags,
       left(args::text, 160) AS args_preview,
       left(errors -> -1 ->> 'error', 160) AS last_error
FROM awa.jobs
WHERE (%(state)s::awa.job_state IS NULL OR state = %(state)s::awa.job_state)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
  AND (%(text)s::text IS NULL OR strpos(args::text, %(text)s::text) > 0)
  -- A text search reads rows one by one: it looks at the newest jobs only.
  AND (%(text)s::text IS NULL
       OR id > (SELECT max(id) FROM awa.jobs) - %(search_window)s::bigint)
  AND (%(after_id)s::bigint IS NULL OR id < %(after_id)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s

-- name: ui_jobs_by_run_at
-- The same page, soonest run_at first, after the cursor (run_at, id): scheduled and
-- retryable jobs are served by jobs_pending_idx.
SELECT id, kind, queue, state, priority, attempt, max_attempts, run_at, created_at,
       attempted_at, finalized_at, tags,
       left(args::text, 160) AS args_preview,
       left(errors -> -1 ->> 'error', 160) AS last_error
FROM awa.jobs
WHERE (%(state)s::awa.job_state IS NULL OR state = %(state)s::awa.job_state)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
  AND (%(text)s::text IS NULL OR strpos(args::text, %(text)s::text) > 0)
  -- A text search reads rows one by one: it looks at the newest jobs only.
  AND (%(text)s::text IS NULL
       OR id > (SELECT max(id) FROM awa.jobs) - %(search_window)s::bigint)
  AND (%(after_id)s::bigint IS NULL
       OR (run_at, id) > (%(after_run_at)s::timestamptz, %(after_id)s::bigint))
ORDER BY run_at, id
LIMIT %(limit)s

-- name: ui_follow_ups_of
-- The jobs whose lineage names this job as their trigger (served by jobs_trigger_idx).
SELECT id, kind, queue, state, created_at,
       metadata -> 'awa:trigger' ->> 'outcome' AS outcome,
       metadata -> 'awa:trigger' ->> 'via' AS via
FROM awa.jobs
WHERE metadata ? 'awa:trigger'
  AND (metadata -> 'awa:trigger' ->> 'id')::bigint = %(id)s
ORDER BY id
LIMIT 200

-- name: ui_job_brief
SELECT id, kind, queue, state FROM awa.jobs WHERE id = %(id)s

-- name: ui_progress
SELECT state, progress, attempt, heartbeat_at FROM awa.jobs WHERE id = %(id)s

-- name: ui_callbacks
-- Jobs parked on an external callback, the soonest to time out first.
SELECT id, kind, queue, callback_id, callback_timeout_at, callback_filter, attempted_at,
       callback_in_handler,
       EXTRACT(EPOCH FROM now() - attempted_at)::float8 AS age
FROM awa.jobs
WHERE state = 'waiting_external'
ORDER BY callback_timeout_at NULLS LAST, id
LIMIT %(limit)s

-- name: ui_failed_groups
-- The most recent failed jobs (at most 10,000, served by jobs_problem_idx) grouped by kind
-- and the first line of their last error.
WITH recent AS (
    SELECT kind, queue, finalized_at,
           split_part(COALESCE(errors -> -1 ->> 'error', ''), E'\n', 1) AS error
    FROM awa.jobs
    WHERE state = 'failed'
    ORDER BY id DESC
    LIMIT 10000
)
SELECT kind, left(error, 300) AS error, count(*) AS count, max(finalized_at) AS last_at,
       array_agg(DISTINCT queue) AS queues
FROM recent
GROUP BY kind, left(error, 300)
ORDER BY count(*) DESC, max(finalized_at) DESC
LIMIT 200

-- name: ui_state_totals
-- Live jobs by state over every queue, from the leader's samples.
SELECT c.key AS state, sum(c.value::bigint)::bigint AS n
FROM awa.queue_samples AS s
CROSS JOIN LATERAL jsonb_each_text(s.counts) AS c
GROUP BY c.key

-- name: ui_parents_of
-- The jobs this job depends on, with their states and how each edge resolved.
SELECT d.parent_id AS id, p.kind, p.state, d.policy, d.resolved
FROM awa.job_dependencies AS d LEFT JOIN awa.jobs AS p ON p.id = d.parent_id
WHERE d.child_id = %(id)s
ORDER BY d.parent_id

-- name: ui_children_of
-- The jobs that depend on this one (at most 200).
SELECT d.child_id AS id, c.kind, c.state, d.policy, d.resolved
FROM awa.job_dependencies AS d JOIN awa.jobs AS c ON c.id = d.child_id
WHERE d.parent_id = %(id)s
ORDER BY d.child_id
LIMIT 200
