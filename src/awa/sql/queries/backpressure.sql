-- name: queue_depth_limits
-- Every queue's depth limit with its depth in the leader's last sample (jobs waiting or
-- running: available, scheduled, retryable, running) and the sample's age in seconds (NULL
-- when no sample of the queue exists: no live jobs when the leader last looked, or no
-- leader). Reads one row per limited queue; nothing counts the job table.
SELECT l.queue, l.max_depth, l.policy,
       COALESCE((s.counts ->> 'available')::bigint, 0)
         + COALESCE((s.counts ->> 'scheduled')::bigint, 0)
         + COALESCE((s.counts ->> 'retryable')::bigint, 0)
         + COALESCE((s.counts ->> 'running')::bigint, 0) AS depth,
       EXTRACT(EPOCH FROM now() - s.sampled_at)::float8 AS sample_age, s.sampled_at
FROM awa.queue_depth_limits AS l
LEFT JOIN awa.queue_samples AS s ON s.queue = l.queue
ORDER BY l.queue

-- name: set_queue_depth_limit
INSERT INTO awa.queue_depth_limits AS l (queue, max_depth, policy)
VALUES (%(queue)s, %(max_depth)s, %(policy)s)
ON CONFLICT (queue) DO UPDATE
SET max_depth = EXCLUDED.max_depth, policy = EXCLUDED.policy, updated_at = now()

-- name: clear_queue_depth_limit
DELETE FROM awa.queue_depth_limits WHERE queue = %(queue)s RETURNING queue
