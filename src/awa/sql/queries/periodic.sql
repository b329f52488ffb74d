-- Periodic jobs (awa.cron_jobs).

-- name: periodic_upsert
-- A schedule declared by a starting runtime: inserted, or its definition updated. The fire
-- history and the pause state stay as they are.
INSERT INTO awa.cron_jobs AS c
    (name, cron_expr, timezone, kind, queue, args, priority, max_attempts, tags, metadata,
     missed_fire_policy)
VALUES (%(name)s, %(cron_expr)s, %(timezone)s, %(kind)s, %(queue)s, %(args)s::jsonb,
        %(priority)s, %(max_attempts)s, %(tags)s::text[], %(metadata)s::jsonb, %(policy)s)
ON CONFLICT (name) DO UPDATE
SET cron_expr = EXCLUDED.cron_expr, timezone = EXCLUDED.timezone, kind = EXCLUDED.kind,
    queue = EXCLUDED.queue, args = EXCLUDED.args, priority = EXCLUDED.priority,
    max_attempts = EXCLUDED.max_attempts, tags = EXCLUDED.tags, metadata = EXCLUDED.metadata,
    missed_fire_policy = EXCLUDED.missed_fire_policy, updated_at = now()
WHERE (c.cron_expr, c.timezone, c.kind, c.queue, c.args, c.priority, c.max_attempts, c.tags,
       c.metadata, c.missed_fire_policy)
    IS DISTINCT FROM
      (EXCLUDED.cron_expr, EXCLUDED.timezone, EXCLUDED.kind, EXCLUDED.queue, EXCLUDED.args,
       EXCLUDED.priority, EXCLUDED.max_attempts, EXCLUDED.tags, EXCLUDED.metadata,
       EXCLUDED.missed_fire_policy)

-- name: periodic_due
-- The schedules the leader evaluates, with the database clock.
SELECT name, cron_expr, timezone, missed_fire_policy, last_enqueued_at, created_at,
       now() AS now
FROM awa.cron_jobs
WHERE paused_at IS NULL
ORDER BY name

-- name: periodic_fire
-- One fire: move last_enqueued_at from what the evaluator read (a compare-and-swap: a fire
-- another leader enqueued already matches nothing) and insert the job, in one statement.
WITH fired AS (
    UPDATE awa.cron_jobs
    SET last_enqueued_at = %(fire)s, updated_at = now()
    WHERE name = %(name)s AND last_enqueued_at IS NOT DISTINCT FROM %(previous)s
      AND paused_at IS NULL
    RETURNING name, kind, queue, args, priority, max_attempts, tags, metadata
)
INSERT INTO awa.active_jobs (kind, queue, args, state, priority, max_attempts, run_at, metadata, tags)
SELECT kind, queue, args, 'available', priority, max_attempts, now(),
       metadata || jsonb_build_object('cron_name', name, 'cron_fire_time', %(fire_text)s::text),
       tags
FROM fired
RETURNING id

-- name: periodic_trigger
-- Enqueue a schedule's job now, paused or not, without moving its fire history.
INSERT INTO awa.active_jobs (kind, queue, args, state, priority, max_attempts, run_at, metadata, tags)
SELECT kind, queue, args, 'available', priority, max_attempts, now(),
       metadata || jsonb_build_object('cron_name', name, 'cron_fire_time', %(at)s::text,
                                      'triggered_manually', true),
       tags
FROM awa.cron_jobs
WHERE name = %(name)s
RETURNING *

-- name: periodic_list
SELECT name, cron_expr, timezone, kind, queue, args, priority, max_attempts, tags, metadata,
       missed_fire_policy, last_enqueued_at, created_at, updated_at, paused_at, paused_by,
       now() AS now
FROM awa.cron_jobs
ORDER BY name

-- name: periodic_pause
UPDATE awa.cron_jobs
SET paused_at = COALESCE(paused_at, now()), paused_by = COALESCE(paused_by, %(paused_by)s),
    updated_at = now()
WHERE name = %(name)s
RETURNING name

-- name: periodic_resume
UPDATE awa.cron_jobs SET paused_at = NULL, paused_by = NULL, updated_at = now()
WHERE name = %(name)s
RETURNING name

-- name: periodic_remove
DELETE FROM awa.cron_jobs WHERE name = %(name)s RETURNING name
