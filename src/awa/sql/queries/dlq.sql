-- The dead-letter queue (awa.dlq_entries, migration 0007): listing, retrying, moving and
-- purging entries, the per-queue setting workers store, and retention. Failed jobs of
-- queues with the DLQ turned on get here through the trigger of migration 0007; these
-- statements are the operator's side. Each is one statement, so it runs the same on a
-- blocking connection, an asyncio one, or inside a caller's transaction.

-- name: dlq_list
-- Newest first. The cursor is the last entry of the previous page: (dlq_at, id) when both
-- are given, else whichever is. NULL filters match everything.
SELECT * FROM awa.dlq_entries
WHERE (%(kind)s::text IS NULL OR kind = %(kind)s::text)
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
  AND CASE
      WHEN %(before_dlq_at)s::timestamptz IS NOT NULL AND %(before_id)s::bigint IS NOT NULL
          THEN (dlq_at, id) < (%(before_dlq_at)s::timestamptz, %(before_id)s::bigint)
      WHEN %(before_dlq_at)s::timestamptz IS NOT NULL THEN dlq_at < %(before_dlq_at)s::timestamptz
      WHEN %(before_id)s::bigint IS NOT NULL THEN id < %(before_id)s::bigint
      ELSE true
  END
ORDER BY dlq_at DESC, id DESC
LIMIT %(limit)s

-- name: dlq_get
SELECT * FROM awa.dlq_entries WHERE id = %(id)s

-- name: dlq_depth
SELECT count(*) AS count FROM awa.dlq_entries
WHERE %(queue)s::text IS NULL OR queue = %(queue)s::text

-- name: dlq_depth_by_queue
SELECT queue, count(*) AS count FROM awa.dlq_entries
GROUP BY queue
ORDER BY count(*) DESC, queue

-- name: dlq_retry
-- Back into awa.jobs under the same id, from a fresh attempt budget: available now, or
-- scheduled for a future run_at. The error history, metadata and tags stay; progress,
-- output and the callback go. run_lease is kept, not reset: the next claim bumps it past
-- every earlier attempt, so a late write of an attempt from before the DLQ cannot match.
-- A job whose unique key another job holds stays in the DLQ (the insert skips it and the
-- entry is deleted only when a job was inserted); holder_id names the holder then.
-- Rows: none (no such entry), or one with revived_id NULL (key held) or set (revived).
WITH entry AS (
    SELECT e.*,
           CASE WHEN %(run_at)s::timestamptz > now() THEN 'scheduled'
                ELSE 'available' END::awa.job_state AS revived_state
    FROM awa.dlq_entries AS e WHERE e.id = %(id)s FOR UPDATE
), keyed AS (
    INSERT INTO awa.unique_keys (unique_key, job_id)
    SELECT e.unique_key, e.id FROM entry AS e
    WHERE e.unique_key IS NOT NULL AND awa.unique_key_held(e.unique_states, e.revived_state)
    ON CONFLICT ON CONSTRAINT jobs_unique_key_idx DO NOTHING
    RETURNING job_id
), revived AS (
    INSERT INTO awa.jobs (
        id, kind, queue, args, state, priority, attempt, max_attempts, run_lease, run_at,
        created_at, attempted_at, finalized_at, heartbeat_at, deadline_at, deadline_duration,
        errors, metadata, tags, unique_key, unique_states, ordering_key, callback_in_handler,
        concurrency_key, workflow_id, has_dependents
    )
    SELECT e.id, e.kind, COALESCE(%(queue)s::text, e.queue), e.args, e.revived_state,
           COALESCE(%(priority)s::smallint, e.priority), 0, e.max_attempts, e.run_lease,
           COALESCE(%(run_at)s::timestamptz, now()), e.created_at, e.attempted_at, NULL, NULL,
           NULL, e.deadline_duration, e.errors, e.metadata, e.tags, e.unique_key,
           e.unique_states, e.ordering_key, false, e.concurrency_key, e.workflow_id,
           e.has_dependents
    FROM entry AS e
    WHERE e.unique_key IS NULL OR NOT awa.unique_key_held(e.unique_states, e.revived_state)
       OR e.id IN (SELECT k.job_id FROM keyed AS k)
    RETURNING *
), removed AS (
    DELETE FROM awa.dlq_entries AS d USING revived AS r WHERE d.id = r.id
)
SELECT e.id AS entry_id, r.id AS revived_id,
       (SELECT h.job_id FROM awa.unique_keys AS h
        WHERE r.id IS NULL AND h.unique_key = e.unique_key) AS holder_id,
       r.*
FROM entry AS e LEFT JOIN revived AS r ON r.id = e.id

-- name: dlq_bulk_retry
-- Every matching entry back into awa.jobs, available now (as dlq_retry). Entries whose
-- unique key a job holds stay in the DLQ, and of entries sharing a key only the newest is
-- revived, the rest stay. Returns how many were revived.
WITH entries AS (
    SELECT * FROM awa.dlq_entries
    WHERE (%(kind)s::text IS NULL OR kind = %(kind)s::text)
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
    ORDER BY id DESC
    FOR UPDATE
), keyed AS (
    INSERT INTO awa.unique_keys (unique_key, job_id)
    SELECT e.unique_key, e.id FROM entries AS e
    WHERE e.unique_key IS NOT NULL AND awa.unique_key_held(e.unique_states, 'available')
    ORDER BY e.id DESC
    ON CONFLICT ON CONSTRAINT jobs_unique_key_idx DO NOTHING
    RETURNING job_id
), revived AS (
    INSERT INTO awa.jobs (
        id, kind, queue, args, state, priority, attempt, max_attempts, run_lease, run_at,
        created_at, attempted_at, finalized_at, heartbeat_at, deadline_at, deadline_duration,
        errors, metadata, tags, unique_key, unique_states, ordering_key, callback_in_handler,
        concurrency_key, workflow_id, has_dependents
    )
    SELECT e.id, e.kind, e.queue, e.args, 'available', e.priority, 0, e.max_attempts,
           e.run_lease, now(), e.created_at, e.attempted_at, NULL, NULL, NULL,
           e.deadline_duration, e.errors, e.metadata, e.tags, e.unique_key, e.unique_states,
           e.ordering_key, false, e.concurrency_key, e.workflow_id, e.has_dependents
    FROM entries AS e
    WHERE e.unique_key IS NULL OR NOT awa.unique_key_held(e.unique_states, 'available')
       OR e.id IN (SELECT k.job_id FROM keyed AS k)
    ORDER BY e.id DESC
    RETURNING id
), removed AS (
    DELETE FROM awa.dlq_entries AS d USING revived AS r WHERE d.id = r.id RETURNING 1
)
SELECT count(*) AS count FROM removed

-- name: dlq_move_failed
-- An operator's move of a failed job (of any queue) into the DLQ, with their reason.
WITH moved AS (
    DELETE FROM awa.jobs WHERE id = %(id)s AND state = 'failed' RETURNING *
)
INSERT INTO awa.dlq_entries
SELECT s.* FROM moved AS m CROSS JOIN LATERAL awa.dlq_snapshot(to_jsonb(m), %(reason)s) AS s
RETURNING *

-- name: dlq_bulk_move_failed
WITH moved AS (
    DELETE FROM awa.jobs
    WHERE state = 'failed'
      AND (%(kind)s::text IS NULL OR kind = %(kind)s::text)
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
    RETURNING *
), inserted AS (
    INSERT INTO awa.dlq_entries
    SELECT s.* FROM moved AS m
    CROSS JOIN LATERAL awa.dlq_snapshot(to_jsonb(m), %(reason)s) AS s
    RETURNING 1
)
SELECT count(*) AS count FROM inserted

-- name: dlq_purge_job
DELETE FROM awa.dlq_entries WHERE id = %(id)s RETURNING id

-- name: dlq_purge
-- The same filters and cursor as dlq_list.
WITH purged AS (
    DELETE FROM awa.dlq_entries
    WHERE (%(kind)s::text IS NULL OR kind = %(kind)s::text)
      AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
      AND (%(tag)s::text IS NULL OR tags @> ARRAY[%(tag)s::text])
      AND CASE
          WHEN %(before_dlq_at)s::timestamptz IS NOT NULL AND %(before_id)s::bigint IS NOT NULL
              THEN (dlq_at, id) < (%(before_dlq_at)s::timestamptz, %(before_id)s::bigint)
          WHEN %(before_dlq_at)s::timestamptz IS NOT NULL
              THEN dlq_at < %(before_dlq_at)s::timestamptz
          WHEN %(before_id)s::bigint IS NOT NULL THEN id < %(before_id)s::bigint
          ELSE true
      END
    RETURNING 1
)
SELECT count(*) AS count FROM purged

-- name: dlq_store_settings
-- A worker's DLQ setting for each queue it runs (the last worker to start wins). A queue
-- that never had the DLQ on gets no row; an unchanged setting is not rewritten. Returns the
-- queues whose setting this changed, with the one they had (NULL: no row).
WITH wanted AS (
    SELECT * FROM unnest(%(queues)s::text[], %(enabled)s::boolean[]) AS w(queue, enabled)
), previous AS (
    SELECT s.queue, s.dlq_enabled FROM awa.queue_settings AS s JOIN wanted USING (queue)
), changed AS (
    SELECT w.queue, p.dlq_enabled AS was, w.enabled
    FROM wanted AS w LEFT JOIN previous AS p USING (queue)
    WHERE COALESCE(p.dlq_enabled, false) <> w.enabled
), stored AS (
    INSERT INTO awa.queue_settings AS s (queue, dlq_enabled)
    SELECT queue, enabled FROM changed
    ON CONFLICT (queue) DO UPDATE
    SET dlq_enabled = EXCLUDED.dlq_enabled, updated_at = now()
)
SELECT queue, was, enabled FROM changed

-- name: dlq_delete_expired
-- Retention: entries moved more than %(retention)s seconds ago, oldest first, in bounded
-- batches (a range on dlq_entries_dlq_at_idx).
WITH doomed AS (
    SELECT id FROM awa.dlq_entries
    WHERE dlq_at < now() - make_interval(secs => %(retention)s)
    ORDER BY dlq_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM awa.dlq_entries AS d USING doomed WHERE d.id = doomed.id RETURNING 1
)
SELECT count(*) AS deleted FROM deleted
