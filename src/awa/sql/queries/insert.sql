-- Producer inserts. An available job goes to awa.active_jobs (whose insert trigger wakes
-- the workers of its queue), a scheduled one to awa.held_jobs (migration 12). A job with a
-- unique key first takes its key in awa.unique_keys: a key already held skips the job
-- (ON CONFLICT DO NOTHING waits for a concurrent holder to commit, so two producers cannot
-- both insert), and the caller compares the returned rows with what it sent to report the
-- conflict.

-- name: insert_jobs
-- Inserts every job described by one JSON array (one parameter, so the same statement runs
-- unchanged through psycopg, asyncpg, SQLAlchemy and Django). A job whose run_at lies in the
-- future (by the database clock) is scheduled; otherwise it is available at once.
-- Ids come from the sequence in input order, so sorting the result by id restores it.
WITH input AS MATERIALIZED (
    SELECT nextval('awa.job_id_seq') AS id, r.kind, r.queue, r.args, r.priority,
           r.max_attempts, r.run_at, r.metadata, r.tags, r.unique_states, r.ordering_key,
           r.deadline_seconds, r.concurrency_key,
           (CASE WHEN r.run_at > now() THEN 'scheduled' ELSE 'available' END)::awa.job_state
               AS state,
           decode(r.unique_key, 'hex') AS unique_key
    FROM jsonb_to_recordset(%(jobs)s::jsonb) AS r(
        kind text,
        queue text,
        args jsonb,
        priority smallint,
        max_attempts smallint,
        run_at timestamptz,
        metadata jsonb,
        tags text[],
        unique_key text,
        unique_states smallint,
        ordering_key text,
        deadline_seconds double precision,
        concurrency_key text
    )
), keyed AS (
    INSERT INTO awa.unique_keys (unique_key, job_id)
    SELECT i.unique_key, i.id FROM input AS i
    WHERE i.unique_key IS NOT NULL AND awa.unique_key_held(i.unique_states, i.state)
    ORDER BY i.id
    ON CONFLICT ON CONSTRAINT jobs_unique_key_idx DO NOTHING
    RETURNING job_id
), kept AS (
    SELECT i.* FROM input AS i
    WHERE i.unique_key IS NULL OR NOT awa.unique_key_held(i.unique_states, i.state)
       OR i.id IN (SELECT k.job_id FROM keyed AS k)
), ready AS (
    INSERT INTO awa.active_jobs (
        id, kind, queue, args, state, priority, max_attempts, run_at, metadata, tags,
        unique_key, unique_states, ordering_key, deadline_duration, concurrency_key
    )
    SELECT k.id, k.kind, k.queue, k.args, k.state, k.priority, k.max_attempts,
           COALESCE(k.run_at, now()), k.metadata, k.tags, k.unique_key, k.unique_states,
           decode(k.ordering_key, 'hex'), make_interval(secs => k.deadline_seconds),
           k.concurrency_key
    FROM kept AS k WHERE k.state = 'available'
    ORDER BY k.id
    RETURNING id, state, run_at, created_at, unique_key
), later AS (
    INSERT INTO awa.held_jobs (
        id, kind, queue, args, state, priority, max_attempts, run_at, metadata, tags,
        unique_key, unique_states, ordering_key, deadline_duration, concurrency_key
    )
    SELECT k.id, k.kind, k.queue, k.args, k.state, k.priority, k.max_attempts, k.run_at,
           k.metadata, k.tags, k.unique_key, k.unique_states, decode(k.ordering_key, 'hex'),
           make_interval(secs => k.deadline_seconds), k.concurrency_key
    FROM kept AS k WHERE k.state = 'scheduled'
    ORDER BY k.id
    RETURNING id, state, run_at, created_at, unique_key
)
-- Only what the database decided; the caller already knows every other column.
SELECT * FROM ready UNION ALL SELECT * FROM later

-- name: insert_job
-- One job, with a parameter per column: cheaper for both sides than the JSON form above (no
-- JSON document to build and unpack), which matters when jobs are inserted one at a time.
-- Same rules: scheduled when run_at lies in the future by the database clock, and no row
-- when its unique key is already held.
WITH input AS MATERIALIZED (
    SELECT nextval('awa.job_id_seq') AS id,
           (CASE WHEN %(run_at)s::timestamptz > now() THEN 'scheduled' ELSE 'available' END)
               ::awa.job_state AS state
), keyed AS (
    INSERT INTO awa.unique_keys (unique_key, job_id)
    SELECT %(unique_key)s::bytea, i.id FROM input AS i
    WHERE %(unique_key)s::bytea IS NOT NULL
      AND awa.unique_key_held(%(unique_states)s::smallint, i.state)
    ON CONFLICT ON CONSTRAINT jobs_unique_key_idx DO NOTHING
    RETURNING job_id
), kept AS (
    SELECT i.* FROM input AS i
    WHERE %(unique_key)s::bytea IS NULL
       OR NOT awa.unique_key_held(%(unique_states)s::smallint, i.state)
       OR EXISTS (SELECT 1 FROM keyed)
), ready AS (
    INSERT INTO awa.active_jobs (
        id, kind, queue, args, state, priority, max_attempts, run_at, metadata, tags,
        unique_key, unique_states, ordering_key, deadline_duration, concurrency_key
    )
    SELECT k.id, %(kind)s, %(queue)s, %(args)s::jsonb, k.state, %(priority)s,
           %(max_attempts)s, COALESCE(%(run_at)s::timestamptz, now()), %(metadata)s::jsonb,
           %(tags)s::text[], %(unique_key)s::bytea, %(unique_states)s::smallint,
           %(ordering_key)s::bytea, %(deadline_duration)s::interval,
           %(concurrency_key)s::text
    FROM kept AS k WHERE k.state = 'available'
    RETURNING id, state, run_at, created_at
), later AS (
    INSERT INTO awa.held_jobs (
        id, kind, queue, args, state, priority, max_attempts, run_at, metadata, tags,
        unique_key, unique_states, ordering_key, deadline_duration, concurrency_key
    )
    SELECT k.id, %(kind)s, %(queue)s, %(args)s::jsonb, k.state, %(priority)s,
           %(max_attempts)s, %(run_at)s::timestamptz, %(metadata)s::jsonb,
           %(tags)s::text[], %(unique_key)s::bytea, %(unique_states)s::smallint,
           %(ordering_key)s::bytea, %(deadline_duration)s::interval,
           %(concurrency_key)s::text
    FROM kept AS k WHERE k.state = 'scheduled'
    RETURNING id, state, run_at, created_at
)
SELECT * FROM ready UNION ALL SELECT * FROM later

-- name: insert_job_plain
-- insert_job for the common job: no run_at, unique key, tags, metadata, ordering key or
-- deadline, so the table's defaults apply (available now); fewer parameters to send, bind
-- and cast.
INSERT INTO awa.active_jobs (kind, queue, args, priority, max_attempts)
VALUES (%(kind)s, %(queue)s, %(args)s::jsonb, %(priority)s, %(max_attempts)s)
RETURNING id, state, run_at, created_at

-- name: unique_key_holders
SELECT job_id AS id, unique_key FROM awa.unique_keys
WHERE unique_key = ANY(%(keys)s::bytea[])

-- name: copy_reserve_ids
-- Ids, the database clock and the active ring's current slot for a COPY batch, fetched in
-- the COPY's own transaction (the slot once, instead of the column's default per row; a
-- rotation meanwhile only leaves the rows in a slot sealed a moment ago).
SELECT now() AS now, awa.active_slot() AS slot,
       array(SELECT nextval('awa.job_id_seq') FROM generate_series(1, %(count)s)) AS ids

-- name: copy_jobs
-- The jobs of a COPY batch due now (copy_jobs_scheduled takes the others).
COPY awa.active_jobs (
    id, kind, queue, args, state, priority, max_attempts, run_at, created_at, metadata, tags,
    ordering_key, deadline_duration, concurrency_key, slot
) FROM STDIN

-- name: copy_jobs_scheduled
COPY awa.held_jobs (
    id, kind, queue, args, state, priority, max_attempts, run_at, created_at, metadata, tags,
    ordering_key, deadline_duration, concurrency_key
) FROM STDIN
