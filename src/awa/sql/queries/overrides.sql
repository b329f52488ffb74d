-- Live queue overrides (migration 16): operators' changes, and the workers' read of them.

-- name: overrides_change
-- One change (set or clear) of a queue's overrides; see awa.change_queue_overrides.
SELECT settings, paused, updated_at, updated_by
FROM awa.change_queue_overrides(
    %(queue)s, %(set)s::jsonb, %(clear)s::text[], %(by)s, %(action)s
)

-- name: overrides_list
-- The stored overrides with each queue's pause, for one queue or all (overridden or paused),
-- by name: an operator's read of two small tables.
SELECT COALESCE(o.queue, q.queue) AS queue, COALESCE(o.settings, '{}'::jsonb) AS settings,
       COALESCE(q.paused, false) AS paused, o.updated_at, o.updated_by
FROM awa.queue_overrides AS o
FULL JOIN (SELECT * FROM awa.queues WHERE paused) AS q ON q.queue = o.queue
WHERE %(queue)s::text IS NULL OR COALESCE(o.queue, q.queue) = %(queue)s::text
ORDER BY 1
LIMIT %(limit)s

-- name: overrides_log
-- The latest changes, newest first, of one queue or all.
SELECT id, queue, changed_at, changed_by, action, old, new
FROM awa.queue_override_log
WHERE %(queue)s::text IS NULL OR queue = %(queue)s::text
ORDER BY id DESC
LIMIT %(limit)s

-- name: overrides_for_worker
-- A worker's read of the overrides of the queues it runs: primary-key lookups in a table of
-- one row per overridden queue, every few seconds and on notification (never the job tables).
SELECT queue, settings FROM awa.queue_overrides WHERE queue = ANY(%(queues)s::text[])

-- name: override_log_delete_expired
-- Retention of the change log: entries older than %(retention)s seconds, oldest first (the
-- log grows in id order with its clock), in bounded batches.
WITH doomed AS (
    SELECT id FROM awa.queue_override_log
    WHERE changed_at < now() - make_interval(secs => %(retention)s)
    ORDER BY id
    LIMIT %(limit)s
), deleted AS (
    DELETE FROM awa.queue_override_log AS l USING doomed WHERE l.id = doomed.id RETURNING 1
)
SELECT count(*) AS deleted FROM deleted
