-- Descriptors of queues and job kinds (migration 0008): stored by a worker at start, kept
-- fresh and pruned by the maintenance leader, listed by operators.

-- name: descriptors_store_queues
-- One row per queue the worker runs. A blank row (descriptor_hash NULL: nothing declared)
-- only refreshes last_seen_at of an existing row, so it never erases a descriptor another
-- deployment declared; a declared one replaces the fields (updated_at moves when they
-- changed).
INSERT INTO awa.queue_descriptors AS d
    (queue, display_name, description, owner, docs_url, tags, extra, descriptor_hash)
SELECT r.queue, r.display_name, r.description, r.owner, r.docs_url,
       COALESCE(r.tags, '{}'), COALESCE(r.extra, '{}'), r.descriptor_hash
FROM jsonb_to_recordset(%(rows)s::jsonb) AS r(
    queue text, display_name text, description text, owner text, docs_url text, tags text[],
    extra jsonb, descriptor_hash text)
ON CONFLICT (queue) DO UPDATE SET
    display_name = CASE WHEN EXCLUDED.descriptor_hash IS NULL THEN d.display_name
                        ELSE EXCLUDED.display_name END,
    description = CASE WHEN EXCLUDED.descriptor_hash IS NULL THEN d.description
                       ELSE EXCLUDED.description END,
    owner = CASE WHEN EXCLUDED.descriptor_hash IS NULL THEN d.owner ELSE EXCLUDED.owner END,
    docs_url = CASE WHEN EXCLUDED.descriptor_hash IS NULL THEN d.docs_url
                    ELSE EXCLUDED.docs_url END,
    tags = CASE WHEN EXCLUDED.descriptor_hash IS NULL THEN d.tags ELSE EXCLUDED.tags END,
    extra = CASE WHEN EXCLUDED.descriptor_hash IS NULL THEN d.extra ELSE EXCLUDED.extra END,
    descriptor_hash = COALESCE(EXCLUDED.descriptor_hash, d.descriptor_hash),
    updated_at = CASE WHEN EXCLUDED.descriptor_hash IS DISTINCT FROM d.descriptor_hash
                       AND EXCLUDED.descriptor_hash IS NOT NULL THEN now()
                      ELSE d.updated_at END,
    last_seen_at = now()

-- name: descriptors_store_kinds
-- One row per kind the worker registers or describes; the same rules as for queues. The
-- kind's queue is that of its task here (a kind described without a task keeps the one a
-- worker with its task stored).
INSERT INTO awa.job_kind_descriptors AS d
    (kind, queue, display_name, description, owner, docs_url, tags, extra, descriptor_hash)
SELECT r.kind, r.queue, r.display_name, r.description, r.owner, r.docs_url,
       COALESCE(r.tags, '{}'), COALESCE(r.extra, '{}'), r.descriptor_hash
FROM jsonb_to_recordset(%(rows)s::jsonb) AS r(
    kind text, queue text, display_name text, description text, owner text, docs_url text,
    tags text[], extra jsonb, descriptor_hash text)
ON CONFLICT (kind) DO UPDATE SET
    queue = COALESCE(EXCLUDED.queue, d.queue),
    display_name = CASE WHEN EXCLUDED.descriptor_hash IS NULL THEN d.display_name
                        ELSE EXCLUDED.display_name END,
    description = CASE WHEN EXCLUDED.descriptor_hash IS NULL THEN d.description
                       ELSE EXCLUDED.description END,
    owner = CASE WHEN EXCLUDED.descriptor_hash IS NULL THEN d.owner ELSE EXCLUDED.owner END,
    docs_url = CASE WHEN EXCLUDED.descriptor_hash IS NULL THEN d.docs_url
                    ELSE EXCLUDED.docs_url END,
    tags = CASE WHEN EXCLUDED.descriptor_hash IS NULL THEN d.tags ELSE EXCLUDED.tags END,
    extra = CASE WHEN EXCLUDED.descriptor_hash IS NULL THEN d.extra ELSE EXCLUDED.extra END,
    descriptor_hash = COALESCE(EXCLUDED.descriptor_hash, d.descriptor_hash),
    updated_at = CASE WHEN EXCLUDED.descriptor_hash IS DISTINCT FROM d.descriptor_hash
                       AND EXCLUDED.descriptor_hash IS NOT NULL THEN now()
                      ELSE d.updated_at END,
    last_seen_at = now()

-- name: descriptors_refresh
-- The leader's refresh: rows of the queues live workers run (and of the kinds registered
-- on them) are seen now. Rows seen in the last minute are left alone, so a sweep rewrites
-- each live row at most once a minute.
WITH live AS (
    SELECT DISTINCT unnest(queues) AS queue FROM awa.runtimes
    WHERE heartbeat_at + stale_after >= now()
), queues AS (
    UPDATE awa.queue_descriptors AS d SET last_seen_at = now()
    FROM live
    WHERE d.queue = live.queue AND d.last_seen_at < now() - interval '1 minute'
    RETURNING 1
), kinds AS (
    UPDATE awa.job_kind_descriptors AS d SET last_seen_at = now()
    FROM live
    WHERE d.queue = live.queue AND d.last_seen_at < now() - interval '1 minute'
    RETURNING 1
)
SELECT (SELECT count(*) FROM queues) AS queues, (SELECT count(*) FROM kinds) AS kinds

-- name: descriptors_prune
-- Rows nothing has seen for the retention: no worker started with them since, and no live
-- worker runs their queue (those are refreshed, but never wait for the refresh).
WITH live AS (
    SELECT DISTINCT unnest(queues) AS queue FROM awa.runtimes
    WHERE heartbeat_at + stale_after >= now()
), queues AS (
    DELETE FROM awa.queue_descriptors AS d
    WHERE d.last_seen_at < now() - make_interval(secs => %(retention)s)
      AND NOT EXISTS (SELECT 1 FROM live WHERE live.queue = d.queue)
    RETURNING 1
), kinds AS (
    DELETE FROM awa.job_kind_descriptors AS d
    WHERE d.last_seen_at < now() - make_interval(secs => %(retention)s)
      AND NOT EXISTS (SELECT 1 FROM live WHERE live.queue = d.queue)
    RETURNING 1
)
SELECT (SELECT count(*) FROM queues) AS queues, (SELECT count(*) FROM kinds) AS kinds

-- name: list_queue_descriptors
-- Every queue's descriptor, blank ones included; live says whether a live worker runs it.
SELECT d.queue, d.display_name, d.description, d.owner, d.docs_url, d.tags, d.extra,
       d.descriptor_hash, d.created_at, d.updated_at, d.last_seen_at,
       EXISTS (
           SELECT 1 FROM awa.runtimes AS r
           WHERE r.heartbeat_at + r.stale_after >= now() AND d.queue = ANY (r.queues)
       ) AS live
FROM awa.queue_descriptors AS d
WHERE (%(queue)s::text IS NULL OR d.queue = %(queue)s::text)
ORDER BY d.queue

-- name: list_job_kind_descriptors
SELECT d.kind, d.queue, d.display_name, d.description, d.owner, d.docs_url, d.tags, d.extra,
       d.descriptor_hash, d.created_at, d.updated_at, d.last_seen_at,
       EXISTS (
           SELECT 1 FROM awa.runtimes AS r
           WHERE r.heartbeat_at + r.stale_after >= now() AND d.queue = ANY (r.queues)
       ) AS live
FROM awa.job_kind_descriptors AS d
WHERE (%(kind)s::text IS NULL OR d.kind = %(kind)s::text)
ORDER BY d.kind
