-- Flow control: fleet-wide limits (awa.claim_limited, migration 0004) and priority aging.

-- name: claim_limited
-- The claim of a queue with limits; rows with a NULL id only carry retry_after.
SELECT * FROM awa.claim_limited(
    %(queue)s, %(limit)s, %(deadline)s, %(rate)s, %(burst)s, %(max_running)s,
    %(key_concurrency)s, %(after_us)s::bigint[], %(after_id)s::bigint[], %(kinds)s::text[]
)

-- name: limits_store
-- At start: the limits this worker runs the queue with, for operators to see. The bucket
-- keeps its tokens (no more than the burst), so a restart grants no extra burst. Returns the
-- limits stored before (no row: none were), read from the statement's snapshot.
WITH previous AS (
    SELECT rate, burst, max_running, key_concurrency
    FROM awa.queue_limits WHERE queue = %(queue)s
), stored AS (
    INSERT INTO awa.queue_limits AS l (queue, rate, burst, max_running, key_concurrency, tokens)
    VALUES (%(queue)s, %(rate)s, %(burst)s, %(max_running)s, %(key_concurrency)s,
            COALESCE(%(burst)s, 0))
    ON CONFLICT (queue) DO UPDATE
    SET rate = EXCLUDED.rate,
        burst = EXCLUDED.burst,
        max_running = EXCLUDED.max_running,
        key_concurrency = EXCLUDED.key_concurrency,
        tokens = least(l.tokens, COALESCE(EXCLUDED.burst, 0)),
        updated_at = now()
    RETURNING l.queue
)
SELECT p.rate, p.burst, p.max_running, p.key_concurrency FROM previous AS p

-- name: limits_clear
-- At start of a worker running the queue without limits. A worker still running it with
-- limits puts its row back at its next claim.
DELETE FROM awa.queue_limits WHERE queue = %(queue)s

-- name: age_priorities
-- Raise the priority (lower the number) of available jobs by one level for each interval
-- they have waited, down to 1: a job aged k times qualifies again once it waited k + 1
-- intervals (run_at is kept). The first aging records the original priority. At most
-- %(limit)s rows per pass, so a huge old backlog costs a bounded amount of work per pass;
-- a row just aged does not qualify again until another interval passed, so the next pass
-- takes others. An aged job sits in a new lane: its queue's claimers are told to look at
-- their lanes from the start (awa_jobs).
WITH aged AS (
    SELECT id FROM awa.active_jobs
    WHERE state = 'available' AND priority > 1
      AND run_at <= now() - %(interval)s::interval
      AND run_at <= now() - %(interval)s::interval * (
          COALESCE((metadata ->> '_awa_original_priority')::integer, priority) - priority + 1
      )
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), changed AS (
    UPDATE awa.active_jobs AS j
    SET priority = j.priority - 1,
        metadata = CASE
            WHEN j.metadata ? '_awa_original_priority' THEN j.metadata
            ELSE j.metadata || jsonb_build_object('_awa_original_priority', j.priority)
        END
    WHERE j.id = ANY(ARRAY(SELECT id FROM aged)) AND j.state = 'available'
    RETURNING j.queue
)
SELECT (SELECT count(*) FROM changed) AS aged,
       (SELECT count(pg_notify('awa_jobs', q.queue))
        FROM (SELECT DISTINCT queue FROM changed) AS q) AS queues
